"""The launch rules, decided again where the engine starts: the scheduler process.

The launcher refuses a launch vradix cannot version in SGLang's argument check (`hooks.launcher`,
`hooks.pd_launcher`: AFTER `ServerArgs.check_server_args`), before any scheduler starts. That is an early copy only:
a launch that never runs that check in a process where vradix is installed (an engine built by another frontend, a
scheduler process started by hand, a Ray actor) would skip it. `check` runs every one of those rules on the
`ServerArgs` a scheduler is built from, before `Scheduler.__init__` builds anything (`hooks.startup`), so such an
engine does not start either, with the same error naming the flag and the alternative.

Invariant: `RULES` holds every rule the launcher's `check_server_args` hooks apply.
"""
from __future__ import annotations

from typing import Callable, Tuple

from vradix import identity
from vradix.closed_world import epd, unversioned
from vradix.core import staleness
from vradix.pd import handshake, restore_policy


def refuse_unversioned_flags(server_args) -> None:
    """`closed_world.unversioned.REFUSALS` (PP > 1 among them) and the EPD flags (`closed_world.epd`)."""
    unversioned.check(server_args)
    epd.check(server_args)


def refuse_unsupported_window(server_args) -> None:
    """A bounded-staleness window with a path it does not support (`core.staleness.check_server`)."""
    staleness.check_server(server_args, staleness.server_window())


def refuse_unsafe_restore_policy(server_args) -> None:
    """A P/D or DCP role whose L3 restore must finish, without `wait_complete` (`pd.restore_policy`)."""
    restore_policy.check(server_args.disaggregation_mode, int(server_args.dcp_size or 1),
                         server_args.hicache_storage_backend, server_args.hicache_storage_prefetch_policy)


def refuse_unmatchable_identity(server_args) -> None:
    """A P/D role whose identity mode the other role can never share (`pd.handshake.check_role_identity`)."""
    handshake.check_role_identity(server_args.disaggregation_mode, identity.mode_from_env(),
                                  server_args.weight_version)


RULES: Tuple[Callable[[object], None], ...] = (refuse_unversioned_flags, refuse_unsupported_window,
                                                refuse_unsafe_restore_policy, refuse_unmatchable_identity)
#: what the rules raise: each error names the flag and the alternative
ERRORS = (unversioned.UnversionedPathError, staleness.StalenessError, restore_policy.RestorePolicyError,
          handshake.RoleIdentityError)


def check(server_args) -> None:
    """Raise the first launch rule's error for `server_args` (each names the flag and the alternative); return if
    the launch is one vradix versions."""
    for rule in RULES:
        rule(server_args)
