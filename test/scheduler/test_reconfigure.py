"""Runtime reconfiguration is checked like a launch, in the scheduler process (`vradix.scheduler.reconfigure`).

The control requests run through SGLang's own scheduler-side handlers, with every vradix hook on them and no
TokenizerManager in the way (so no launcher-side copy of a check runs): `Scheduler.attach_hicache_storage_wrapped` /
`detach_hicache_storage_wrapped` on a real UnifiedRadixCache with its real HiCache controller, host pool and `file`
store (`vradix.testing.harness.l3_store`), and `SchedulerInternalStateController.set_internal_state`. Publications
go through `vradix.scheduler.publication.bump_scheduler`, the step every publication hook runs.
"""
from __future__ import annotations

import types
from array import array

from sglang.srt.managers.io_struct import SetInternalStateReq
from sglang.srt.managers.scheduler_components.internal_state import SchedulerInternalStateController
from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.runtime_context import get_context
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

from vradix.core import reclaim
from vradix.engine import attach
from vradix.scheduler import publication
from vradix.testing.harness.l3_store import (PROMPT, RuntimeStorageScheduler, file_store_cache, start_prefetch,
                                             store_pages)

RUNTIME_HOST_TIER = {"with_storage": False, "enable_hierarchical_cache": True}


def host_hit(cache, tokens, extra_key) -> int:
    """Tokens of `tokens` the tree holds in host memory under `extra_key`."""
    return cache.match_prefix(MatchPrefixParams(key=RadixKey(array("q", tokens), extra_key=extra_key))).host_hit_length


def resolved(name: str):
    """A configuration field as the engine now runs it (startup value and runtime overrides)."""
    return get_context().resolved_server_args_dict().get(name)


def test_a_storage_attached_at_runtime_makes_the_next_publication_revoke_queued_prefetches(tmp_path):
    """An engine started with a host tier only reads its publication steps at startup (no L3 lookups); a runtime
    attach turns lookups on, and the steps are derived again: a publication with a prefetch of the old weights'
    pages in flight revokes it, and the old pages never land. A detach turns the step off again."""
    with file_store_cache(tmp_path, **RUNTIME_HOST_TIER) as fx:
        cache = fx.cache
        state = attach(cache, with_ledger=False)
        sched = RuntimeStorageScheduler(fx)
        assert not publication.install_steps(sched).storage_lookups  # what startup derived

        out = sched.attach()
        assert out.success, out.message
        assert sched.enable_hicache_storage and resolved("hicache_storage_backend") == "file"
        assert publication.steps_of(sched).storage_lookups, "the attach left the startup steps in place"

        old_ns = state.prefix_of_epoch(0)
        store_pages(fx, PROMPT, old_ns)
        reclaim.free_all_by_reset(cache)  # the pages are in L3 only
        cache.write_through_threshold = 1 << 30  # the host pool holds only the prefetch
        queued = fx.make_req(PROMPT + [7, 8, 9, 10])
        state.admit_or_raise(queued)
        sched.waiting_queue = [queued]
        op = start_prefetch(sched, queued)

        publication.bump_scheduler(sched, reason="test publication")
        assert op.is_terminated() and not cache.ongoing_prefetch, "the prefetch of the old weights was not revoked"
        cache.check_hicache_events()
        cache.check_hicache_events()
        assert host_hit(cache, PROMPT, old_ns) == 0
        assert queued.extra_key.startswith(state.prefix_of_epoch(1))

        sched.waiting_queue = []
        out = sched.detach()
        assert not sched.enable_hicache_storage
        assert not publication.steps_of(sched).storage_lookups, "the detach left L3 lookups on"


def test_a_runtime_attach_the_launch_refuses_is_refused_by_the_scheduler_and_changes_nothing(tmp_path):
    """`--enable-streaming-session` with `--hicache-storage-backend` does not launch; an engine started with sessions
    and a host tier refuses the same storage at attach (the launch's error), and nothing changed: no backend, no
    storage flag, no override of the configuration, no lookup step."""
    with file_store_cache(tmp_path, enable_streaming_session=True, **RUNTIME_HOST_TIER) as fx:
        attach(fx.cache, with_ledger=False)
        sched = RuntimeStorageScheduler(fx)
        publication.install_steps(sched)
        overrides = get_context().overrides_log()

        out = sched.attach()
        assert not out.success
        assert "--enable-streaming-session with --hicache-storage-backend" in out.message, out.message
        assert not sched.enable_hicache_storage and not fx.cache.enable_storage
        assert fx.cache.cache_controller.storage_backend is None
        assert get_context().overrides_log() == overrides and resolved("hicache_storage_backend") is None
        assert not publication.steps_of(sched).storage_lookups


def internal_state_controller() -> SchedulerInternalStateController:
    """SGLang's scheduler-side controller of `/set_internal_state` on a scheduler stand-in that has what its
    threshold handlers read (no draft algorithm, the acceptance statistics)."""
    scheduler = types.SimpleNamespace(
        spec_algorithm=SpeculativeAlgorithm.NONE,
        metrics_reporter=types.SimpleNamespace(spec_total_num_accept_tokens=0, spec_total_num_forward_ct=0))
    return SchedulerInternalStateController(scheduler, record_step_time=False)


def test_relaxed_speculative_acceptance_is_refused_by_the_scheduler_without_the_launcher():
    """The request reaches the scheduler-side controller directly (the launcher's `TokenizerControlMixin` hook is
    not on this path): a threshold below 1 is refused (`updated=False`) and nothing is overridden; 1.0 applies."""
    with get_context().override_server_args():
        controller = internal_state_controller()
        overrides = get_context().overrides_log()
        for key in ("speculative_accept_threshold_single", "speculative_accept_threshold_acc"):
            out = controller.set_internal_state(SetInternalStateReq(server_args={key: 0.5}))
            assert out.updated is False, f"{key}=0.5 was applied by the scheduler"
            assert get_context().overrides_log() == overrides
        out = controller.set_internal_state(SetInternalStateReq(server_args={"speculative_accept_threshold_acc": 1.0}))
        assert out.updated and resolved("speculative_accept_threshold_acc") == 1.0
