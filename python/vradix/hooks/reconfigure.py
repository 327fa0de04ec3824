"""Runtime reconfiguration hooks (scheduler process): a control request that changes the engine's configuration is
checked like a launch where the scheduler receives it, and what startup derived is derived again
(`vradix.scheduler.reconfigure`). The launcher's copies (`pd_launcher.refuse_unsafe_restore_policy_at_attach`,
`launcher.refuse_relaxed_speculative_acceptance`) only answer earlier.

- HiCache storage attach (`PUT /hicache/storage-backend`): the resulting configuration (the backend and the policies
  the request names) must pass every launch rule and the engine's startup rules, else the attach fails with the
  reason (HTTP 400) and nothing is attached; after a successful attach the publication steps are derived again, so a
  publication revokes and re-issues the queued storage prefetches;
- HiCache storage detach (`DELETE /hicache/storage-backend`): the steps are derived again (lookups off);
- `/set_internal_state`: a key set the launch would refuse (a speculative acceptance threshold below 1) is refused
  (`updated=False`, SGLang's answer for a rejected update, the reason in the scheduler's log) and nothing is set;
  after an applied update the steps are derived again.
"""
from __future__ import annotations

from vradix.hooks.startup import ledger_blind_spots
from vradix.scheduler import reconfigure

#: `AttachHiCacheStorageReqInput` field -> the `ServerArgs` field it sets (SGLang's own mapping in the handler)
ATTACH_FIELDS = {"hicache_storage_backend": "hicache_storage_backend",
                 "hicache_storage_backend_extra_config_json": "hicache_storage_backend_extra_config",
                 "hicache_storage_prefetch_policy": "hicache_storage_prefetch_policy",
                 "hicache_write_policy": "hicache_write_policy"}


def attach_changes(recv_req) -> dict:
    """The configuration fields an attach request changes (a field it leaves None keeps the engine's value)."""
    return {field: getattr(recv_req, name) for name, field in ATTACH_FIELDS.items()
            if name == "hicache_storage_backend" or getattr(recv_req, name, None) is not None}


def recheck_storage_attach(original, scheduler, recv_req, *args, **kwargs):
    """AROUND Scheduler.attach_hicache_storage_wrapped: refuse an attach whose resulting configuration the launch
    would refuse (nothing attached); after a successful one, derive the publication steps again."""
    from sglang.srt.managers.io_struct import AttachHiCacheStorageReqOutput

    if getattr(scheduler, "enable_hierarchical_cache", False):  # else SGLang answers "not enabled" itself
        reason = reconfigure.refusal(scheduler, attach_changes(recv_req), ledger_blind_spots(scheduler))
        if reason is not None:
            return AttachHiCacheStorageReqOutput(success=False, message=reason)
    out = original(scheduler, recv_req, *args, **kwargs)
    reconfigure.rederive(scheduler)
    return out


def rederive_after_storage_detach(original, scheduler, *args, **kwargs):
    """AROUND Scheduler.detach_hicache_storage_wrapped: derive the publication steps again (L3 lookups off)."""
    out = original(scheduler, *args, **kwargs)
    reconfigure.rederive(scheduler)
    return out


def recheck_internal_state(original, controller, recv_req, *args, **kwargs):
    """AROUND SchedulerInternalStateController.set_internal_state: refuse keys whose resulting configuration the
    launch would refuse (nothing set, `updated=False`); after an applied update, derive the steps again."""
    from sglang.srt.managers.io_struct import SetInternalStateReqOutput

    scheduler = controller.scheduler
    if reconfigure.refusal(scheduler, dict(recv_req.server_args or {})) is not None:
        return SetInternalStateReqOutput(updated=False)
    out = original(controller, recv_req, *args, **kwargs)
    if out.updated:
        reconfigure.rederive(scheduler)
    return out
