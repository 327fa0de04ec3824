"""P/D disaggregation hooks (launcher process): refuse what a role cannot serve before anything reaches a scheduler.

- bad input: a decode-role request without usable bootstrap fields is refused in the tokenizer manager
  (`vradix.pd.bootstrap`), so the client gets HTTP 400 naming the fields and the decode scheduler never sees it;
- identity: a role whose weight identity mode the other role can never share (`nonce`) is refused at startup
  (`vradix.pd.handshake.check_role_identity`);
- restore policy: a role whose L3 restore must finish (decode with L3, DCP) is refused at startup and at runtime
  attach unless its effective prefetch policy is `wait_complete` (`vradix.pd.restore_policy`).

The scheduler-process P/D hooks are in `hooks.pd`.
"""
from __future__ import annotations

from vradix import identity
from vradix.pd import bootstrap, handshake, restore_policy


def reject_decode_request_without_bootstrap(tokenizer_manager, obj, *args, **kwargs):
    """BEFORE TokenizerManager._validate_one_request (once per request, and per element of a batch): on a decode-role
    engine, raise MissingBootstrapError (HTTP 400) unless the request names its prefill peer. Other roles pass."""
    from sglang.srt.managers.io_struct import GenerateReqInput
    from sglang.srt.runtime_context import get_disagg

    disagg = get_disagg()
    if disagg.disaggregation_mode != "decode" or not isinstance(obj, GenerateReqInput):
        return
    bootstrap.check_decode_request(obj.bootstrap_host, obj.bootstrap_port, obj.bootstrap_room,
                                   disagg.disaggregation_transfer_backend)


def refuse_unsafe_restore_policy_at_startup(_result, server_args, *args, **kwargs):
    """AFTER ServerArgs.check_server_args (launcher, before any scheduler starts): the server fails to start with
    RestorePolicyError when its role needs `wait_complete` and its L3 storage is configured with another policy."""
    restore_policy.check(server_args.disaggregation_mode, int(server_args.dcp_size or 1),
                         server_args.hicache_storage_backend, server_args.hicache_storage_prefetch_policy)


def refuse_unmatchable_identity_at_startup(_result, server_args, *args, **kwargs):
    """AFTER ServerArgs.check_server_args (launcher, before any scheduler starts): a P/D role whose identity mode can
    never pass the handshake (`nonce`, or `declared` without a startup label) fails to start with RoleIdentityError.
    The mode is the launcher's (`--vradix-weight-identity` is exported before the arguments are checked)."""
    handshake.check_role_identity(server_args.disaggregation_mode, identity.mode_from_env(),
                                  server_args.weight_version)


async def refuse_unsafe_restore_policy_at_attach(original, tokenizer_manager, hicache_storage_backend,
                                                 hicache_storage_backend_extra_config_json=None,
                                                 hicache_storage_prefetch_policy=None, *args, **kwargs):
    """AROUND TokenizerControlMixin.attach_hicache_storage (`PUT /hicache/storage-backend`): an attach whose effective
    policy (the requested one, else the server's) breaks the role's rule fails (HTTP 400 with the reason) before the
    request is sent to any scheduler; nothing is attached."""
    from sglang.srt.managers.io_struct import AttachHiCacheStorageReqOutput

    args_ = tokenizer_manager.server_args
    policy = restore_policy.effective_policy(hicache_storage_prefetch_policy, args_.hicache_storage_prefetch_policy)
    try:
        restore_policy.check(args_.disaggregation_mode, int(args_.dcp_size or 1), hicache_storage_backend, policy)
    except restore_policy.RestorePolicyError as e:
        return AttachHiCacheStorageReqOutput(success=False, message=str(e))
    return await original(tokenizer_manager, hicache_storage_backend, hicache_storage_backend_extra_config_json,
                          hicache_storage_prefetch_policy, *args, **kwargs)
