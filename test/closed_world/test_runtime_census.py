"""The runtime census (`vradix_census.runtime`) reads SGLang's live code, and every change it marks
`re-checked` is hooked where the scheduler receives it.

- a configuration override SGLang adds (a `get_context().override` call in its sources) appears as a row of its own
  and fails the census until classified, as does a `/set_internal_state` key and a dispatched request type whose
  handler attaches storage;
- every `re-checked` row names a scheduler-side hook that `vradix.hooks.HOOKS` installs.

No server starts; SGLang's classes and sources are real.
"""
import importlib

import vradix_census as census
from vradix_census import runtime

PLANTED_MODULE = '''
from sglang.srt.runtime_context import get_context


class PlantedComponent:
    def change_at_runtime(self, value):
        get_context().override("planted.runtime_change", max_running_requests=value)

    def change_through_a_name(self):
        source = "planted.named_source"
        get_context().override(source, chunked_prefill_size=1)
'''


def test_a_planted_override_site_is_enumerated_and_fails_the_census_unclassified(tmp_path):
    planted = tmp_path / "planted_component.py"
    planted.write_text(PLANTED_MODULE)
    sites = runtime.override_sites([*runtime.sglang_sources(), planted])
    assert sites["override[planted.runtime_change]"] == ["planted_component:change_at_runtime(max_running_requests)"]
    assert "override[planted.named_source]" in sites
    live = set(runtime.enumerate_runtime()) | set(sites)
    assert census.unclassified(runtime.RUNTIME, live) == ["override[planted.named_source]",
                                                          "override[planted.runtime_change]"]


def test_a_planted_key_and_a_planted_storage_request_are_enumerated_and_fail_the_census_unclassified():
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.managers.scheduler_components.internal_state import SchedulerInternalStateController
    from sglang.utils import TypeBasedDispatcher

    class PlantedStorageReq:
        pass

    class PlantingScheduler(Scheduler):
        def init_request_dispatcher(self):
            super().init_request_dispatcher()
            self._request_dispatcher += TypeBasedDispatcher([(PlantedStorageReq, self.handle_planted)])

        def handle_planted(self, recv_req):
            return self.tree_cache.attach_storage_backend(storage_backend="file")

    class PlantingController(SchedulerInternalStateController):
        def _update_handlers(self):
            return {**super()._update_handlers(), "planted_key": None}

    live = runtime.enumerate_runtime(PlantingScheduler)
    keys = runtime.control.internal_state_keys(controller_class=PlantingController)
    live = sorted(set(live) | {f"SetInternalStateReq[{k}]" for k in keys})
    assert census.unclassified(runtime.RUNTIME, live) == ["PlantedStorageReq", "SetInternalStateReq[planted_key]"]


def test_the_live_code_is_classified():
    live = runtime.enumerate_runtime()
    assert {"AttachHiCacheStorageReqInput", "DetachHiCacheStorageReqInput", "LoadLoRAAdapterReqInput",
            "override[scheduler.attach_hicache]", "SetInternalStateReq[speculative_accept_threshold_single]"} <= set(live)
    assert not census.unclassified(runtime.RUNTIME, live)


def test_every_re_checked_row_is_hooked_where_the_scheduler_receives_it():
    from vradix.hooks import HOOKS

    problems = []
    for name, entry in runtime.RUNTIME.items():
        if entry.class_ != "re-checked":
            continue
        if entry not in runtime.RECHECKED_BY:
            problems.append(f"{name}: no scheduler-side hook named in RECHECKED_BY")
            continue
        target, hook = runtime.RECHECKED_BY[entry]
        module, function = hook.split(".")
        fn = getattr(importlib.import_module(f"vradix.hooks.{module}"), function)
        if not any(t == target and h is fn for t, _, h in HOOKS):
            problems.append(f"{name}: {hook} is not installed on {target}")
    assert not problems, "\n".join(problems)
