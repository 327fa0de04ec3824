"""What a plain request costs, counted: vradix's function calls and hook invocations per request in the cache-level
steady loop (`vradix.testing.harness.steady`: GRPO groups of plain requests through SGLang's real
`UnifiedRadixCache`, the scheduler's per-request and per-batch steps), on both tree cores.

Counted with `sys.setprofile`, deterministic: a *vradix call* is a Python frame whose module is vradix's (its
globals' `__name__`, so the `__init__` a dataclass generates counts too; `vradix.testing`, the loop itself, does
not); a *hook invocation* is a call of a function `vradix.hooks.HOOKS` registers, which on a server is one
HookRegistry wrapper frame (the loop calls some of them directly, as the scheduler's wrapper would). Per-batch work
counts once per batch, spread over the batch's requests. Timed figures live in `benchmark/cache/bench_publication.py`
(docs/benchmarks.md)."""
from __future__ import annotations

import sys
from collections import Counter

import pytest

from vradix.engine import Engine, attach
from vradix.testing.harness import steady
from vradix.testing.harness.cache_fixture import build_cache

#: the budget (docs/engine.md): vradix function calls and hook invocations per plain request
MAX_CALLS = 12
MAX_HOOKS = 4
#: requests counted, after as many untimed ones on other prompts (first-use costs stay out of the count)
REQUESTS = 96


#: the most product modules a plain request's walk (queue, match, prefill pass, forward batch, result, release) enters
MAX_MODULES = 6


def count_plain_requests(core: str) -> tuple[float, float, Counter]:
    """(vradix calls per request, hook invocations per request, calls by module.function) over `REQUESTS` plain
    requests."""
    from sglang.srt.plugins import load_plugins

    from vradix.hooks import HOOKS

    load_plugins()  # vradix's hooks on SGLang's functions, as in a server (idempotent)
    fx = build_cache(core, 1, kv_tokens=1 << 16, max_reqs=64)
    attach(fx.cache)
    steady.serve(fx, steady.prompts(REQUESTS, base=40000))
    hook_code = {h.__code__ for _, _, h in HOOKS if hasattr(h, "__code__")}
    calls: Counter = Counter()
    hooks = 0

    def profile(frame, event, _arg):
        nonlocal hooks
        if event != "call":
            return
        module = frame.f_globals.get("__name__", "")
        if module.startswith("vradix.") and not module.startswith("vradix.testing"):
            calls[f"{module}.{frame.f_code.co_name}"] += 1
            hooks += frame.f_code in hook_code

    prompts = steady.prompts(REQUESTS)
    sys.setprofile(profile)
    try:
        steady.serve(fx, prompts)
    finally:
        sys.setprofile(None)
    return sum(calls.values()) / REQUESTS, hooks / REQUESTS, calls


@pytest.fixture(autouse=True)
def serving_only(monkeypatch):
    """The count is of what serving runs: the suite's census test mode (which checks every forward) is off."""
    monkeypatch.delenv("VRADIX_CENSUS", raising=False)


@pytest.mark.parametrize("core", ["rust", "python"])
def test_a_plain_request_costs_at_most_twelve_vradix_calls_and_four_hook_invocations(core):
    calls, hooks, by_function = count_plain_requests(core)
    table = "\n".join(f"{n / REQUESTS:6.3f}  {name}" for name, n in by_function.most_common())
    # the count saw the hooks SGLang's own functions run (a loop without them would count too little)
    assert by_function["vradix.hooks.serving.before_match"] == by_function["vradix.hooks.serving.release"] == REQUESTS
    assert calls <= MAX_CALLS, f"{calls:.3f} vradix calls per plain request (budget {MAX_CALLS}):\n{table}"
    assert hooks <= MAX_HOOKS, f"{hooks:.3f} hook invocations per plain request (budget {MAX_HOOKS}):\n{table}"


def test_a_plain_request_walks_through_at_most_six_product_modules():
    """A newcomer following one plain request reads: the serving hooks, the engine, the request record, and the KV
    page ledger (its guard, its page table, its kernels)."""
    _, _, by_function = count_plain_requests("rust")
    modules = {name.rsplit(".", 1)[0] for name in by_function}
    assert len(modules) <= MAX_MODULES, sorted(modules)
    assert modules == {"vradix.hooks.serving", "vradix.engine", "vradix.request", "vradix.ledger.guard",
                       "vradix.ledger.device", "vradix.kernels.reference"}


def test_the_count_sees_one_planted_call_per_request(monkeypatch):
    """The counter cannot miss a regression: one extra vradix function on the match path (a wrapper compiled into
    `vradix.engine`, as a helper someone adds there would be) is exactly one more call per request, and a loop at
    the budget then fails it."""
    import types

    import vradix.engine as engine_module

    before, hooks_before, _ = count_plain_requests("rust")
    match = Engine.before_match

    def before_match(self, req, cache, token_ids=None):
        return match(self, req, cache, token_ids)

    planted = types.FunctionType(before_match.__code__, vars(engine_module), "before_match", None,
                                 before_match.__closure__)
    monkeypatch.setattr(Engine, "before_match", planted)
    after, hooks_after, by_function = count_plain_requests("rust")
    assert after == pytest.approx(before + 1), (before, after)
    assert hooks_after == hooks_before
    assert by_function["vradix.engine.before_match"] == 2 * REQUESTS
