"""The control census (`vradix_census.control`) reads SGLang's live objects, and its publications are
vradix's.

- the request census is what `Scheduler.init_request_dispatcher` registers: a type a Scheduler subclass adds to the
  dispatcher appears in it (and fails the census until classified), as does a key an internal-state controller can
  set; handlers are read off the live dispatcher;
- the route census sees a route SGLang registers only under an import-time setting, without touching the loaded
  server module, and vradix's own routes are exactly what vradix's launch hooks add;
- the coroutine census sees a coroutine a hook wrapped, and a coroutine a TokenizerManager subclass adds;
- every `publication` request is bumped by a vradix hook on the method its live handler runs, and every
  `publication` route or coroutine forwards a publication request;
- a coroutine classified by the request it forwards names that request type in its own code.

No server starts; SGLang's classes are real.
"""
import inspect
import os
import pathlib

import pytest

import vradix_census as census
from vradix_census import control

ROOT = pathlib.Path(__file__).resolve().parents[2]
_SCHED = "sglang.srt.managers.scheduler.Scheduler"
_UPDATER = "sglang.srt.managers.scheduler_components.weight_updater.SchedulerWeightUpdaterManager"

#: publication request -> (the handler the live dispatcher names, the HOOKS target and hook that bump it)
PUBLICATION_HOOKS = {
    "UpdateWeightFromDiskReqInput": ("weight_updater.update_weights_from_disk",
                                     f"{_UPDATER}.update_weights_from_disk", "publication.publish_update_from_disk"),
    "UpdateWeightsFromDistributedReqInput": ("weight_updater.update_weights_from_distributed",
                                             f"{_UPDATER}.update_weights_from_distributed",
                                             "publication.publish_update_from_distributed"),
    "UpdateWeightsFromTensorReqInput": ("weight_updater.update_weights_from_tensor",
                                        f"{_UPDATER}.update_weights_from_tensor",
                                        "publication.publish_update_from_tensor"),
    "UpdateWeightsFromIPCReqInput": ("weight_updater.update_weights_from_ipc", f"{_UPDATER}.update_weights_from_ipc",
                                     "publication.publish_update_from_ipc"),
    "EndWeightUpdateReqInput": ("weight_updater.end_weight_update", f"{_UPDATER}.end_weight_update",
                                "publication.publish_on_bucketed_update_end"),
    # SGLang's handler records the label through record_weight_version_change, where the bump is
    "UpdateWeightVersionReqInput": ("handle_update_weight_version", f"{_SCHED}.record_weight_version_change",
                                    "publication.publish_on_version_change"),
    # SGLang's flush wrapper calls Scheduler.flush_cache, where vradix's flush is
    "FlushCacheReqInput": ("flush_wrapper.handle", f"{_SCHED}.flush_cache", "publication.lock_aware_flush"),
    "CheckWeightsReqInput": ("weight_updater.check_weights", f"{_UPDATER}.check_weights",
                             "publication.publish_weights_checker_reset"),
    "ResumeMemoryOccupationReqInput": ("weight_updater.resume_memory_occupation",
                                       f"{_UPDATER}.resume_memory_occupation",
                                       "publication.publish_weights_resumed_without_backup"),
}
#: publications whose hooks land with the control-request refusals (test/e2e/test_control_requests.py); checked as
#: soon as that test file exists
LANDING_WITH_CONTROL_REQUESTS = {"CheckWeightsReqInput", "ResumeMemoryOccupationReqInput"}


def handler_name(handler) -> str:
    """A placeholder's path (`weight_updater.update_weights_from_disk`), else the function's name."""
    return handler.path if isinstance(handler, control.Placeholder) else handler.__name__


def test_a_request_type_a_scheduler_registers_appears_in_the_census_and_fails_it_unclassified():
    """A Scheduler whose `init_request_dispatcher` also registers a type of its own (as a mixin or plugin would, with
    SGLang's `TypeBasedDispatcher.__iadd__`): the type is enumerated, and the census names it as unclassified."""
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.utils import TypeBasedDispatcher

    class PlantedControlReq:
        pass

    class PlantingScheduler(Scheduler):
        def init_request_dispatcher(self):
            super().init_request_dispatcher()
            self._request_dispatcher += TypeBasedDispatcher([(PlantedControlReq, self.handle_planted)])

        def handle_planted(self, recv_req):
            return None

    live = control.enumerate_requests(PlantingScheduler)
    assert set(live) - set(control.enumerate_requests()) == {"PlantedControlReq"}
    assert census.unclassified(control.REQUESTS, live) == ["PlantedControlReq"]
    assert not census.vanished(control.REQUESTS, live)


def test_handlers_are_read_off_the_live_dispatcher():
    """Bound methods for the scheduler's own handlers, placeholder paths for its components' (no component is built)."""
    from sglang.srt.managers.io_struct import TokenizedGenerateReqInput, UpdateWeightFromDiskReqInput
    from sglang.srt.managers.scheduler import Scheduler

    handlers = control.dispatched()
    assert handlers[UpdateWeightFromDiskReqInput].path == "weight_updater.update_weights_from_disk"
    generate = handlers[TokenizedGenerateReqInput]
    assert generate.__func__ is Scheduler.handle_generate_request
    assert isinstance(generate.__self__, Scheduler)


def test_a_key_the_internal_state_controller_can_set_is_a_row_of_its_own():
    from sglang.srt.managers.scheduler_components.internal_state import SchedulerInternalStateController

    class PlantingController(SchedulerInternalStateController):
        def _update_handlers(self):
            return {**super()._update_handlers(), "planted_key": None}

    assert "SetInternalStateReq[speculative_accept_threshold_single]" in control.enumerate_requests()
    keys = control.internal_state_keys(controller_class=PlantingController)
    assert set(keys) - set(control.internal_state_keys()) == {"planted_key"}


def test_a_route_registered_only_under_an_import_time_setting_is_enumerated_and_the_loaded_app_is_untouched():
    from sglang.srt.entrypoints import http_server

    loaded = {control.route_key(r) for r in control.flat_routes(http_server.app.routes)}
    environ = dict(os.environ)
    routes = control.enumerate_routes()
    if os.environ.get("DUMPER_SERVER_PORT") != "reuse":
        assert "POST /dumper/{method}" not in loaded
    assert "POST /dumper/{method}" in routes
    assert loaded <= set(routes)
    assert {control.route_key(r) for r in control.flat_routes(http_server.app.routes)} == loaded
    assert dict(os.environ) == environ


def test_the_routes_vradix_adds_are_its_routes_in_the_census():
    """Every hook vradix runs before `launch_server`, run on SGLang's app: the routes it adds are `OWN_ROUTES`
    (the app is restored afterwards)."""
    from sglang.srt.entrypoints.http_server import app

    from vradix.hooks import HOOKS

    routes, middleware = list(app.router.routes), list(app.user_middleware)
    try:
        for target, _kind, hook in HOOKS:
            if target == "sglang.srt.entrypoints.http_server.launch_server":
                hook()
        added = {control.route_key(r) for r in control.flat_routes(app.routes)}
    finally:
        app.router.routes[:], app.user_middleware[:] = routes, middleware
    assert added - {control.route_key(r) for r in control.flat_routes(routes)} == set(control.OWN_ROUTES)
    assert set(control.OWN_ROUTES) <= set(control.ROUTES)


def test_a_coroutine_a_hook_wrapped_or_a_subclass_added_is_enumerated():
    from sglang.srt.managers.tokenizer_manager import TokenizerManager
    from sglang.srt.plugins.hook_registry import HookType, _wrap_fn

    wrapped = _wrap_fn(TokenizerManager.flush_cache, lambda original, *a, **k: original(*a, **k), HookType.AROUND)
    assert not inspect.iscoroutinefunction(wrapped) and control.is_async(wrapped)

    class PlantingTokenizerManager(TokenizerManager):
        async def planted_control(self):
            return None

    live = control.public_coroutines(PlantingTokenizerManager)
    assert census.unclassified(control.COROUTINES, live) == ["planted_control"]


def is_hooked(target: str, hook: str) -> bool:
    """Whether `HOOKS` attaches the hook named `module.attribute` (a module of `vradix.hooks`) to `target`."""
    import importlib

    from vradix.hooks import HOOKS
    module, attribute = hook.split(".")
    function = getattr(importlib.import_module(f"vradix.hooks.{module}"), attribute, None)
    return any(t == target and h is function for t, _, h in HOOKS)


def control_requests_tests_exist() -> bool:
    return next((ROOT / "test").rglob("test_control_requests.py"), None) is not None


def test_every_publication_request_is_bumped_by_a_vradix_hook_on_what_its_live_handler_runs():
    publications = {n for n, e in control.REQUESTS.items() if e.class_ == "publication"}
    assert publications == set(PUBLICATION_HOOKS), "a new publication needs its hook named here"
    handlers = {t.__name__: handler_name(h) for t, h in control.dispatched().items()}
    problems = []
    for name, (handler, target, hook) in PUBLICATION_HOOKS.items():
        if handlers[name] != handler:
            problems.append(f"{name}: SGLang dispatches it to {handlers[name]}, not {handler}")
        if not is_hooked(target, hook) and (name not in LANDING_WITH_CONTROL_REQUESTS
                                             or control_requests_tests_exist()):
            problems.append(f"{name}: no {hook} on {target} in vradix.hooks.HOOKS")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("block", ["routes", "coroutines"])
def test_every_publication_route_and_coroutine_forwards_a_publication_request(block):
    _title, _enumerate, table = control.TABLES[block]
    requests = [e for e in control.REQUESTS.values() if e.class_ == "publication"]
    assert [n for n, e in table.items() if e.class_ == "publication" and e not in requests] == []


def test_a_coroutine_classified_by_the_request_it_forwards_names_that_request_type():
    """Each `FORWARDS` pair, on every tokenizer class that defines the coroutine (a multi-tokenizer worker overrides
    pause and continue): the request type's name is in the coroutine's own code."""
    problems = []
    for cls in control.tokenizer_classes():
        for name, request in control.FORWARDS.items():
            fn = cls.__dict__.get(name)
            if fn is not None and request not in inspect.getsource(inspect.unwrap(fn)):
                problems.append(f"{cls.__name__}.{name} does not name {request}")
    assert not problems, problems
