"""One per-request state object and the guard paths that read it, against SGLang's real
UnifiedRadixCache and allocators: a request carries exactly one vradix attribute, a request vradix never admitted is
refused at the match instead of being treated as "current epoch", and the sample guard's log names the request whose
row is corrupt."""
import logging

import pytest
import torch

from sglang.srt.mem_cache import common

from vradix import request
from vradix.ledger.guard import GuardConfig
from vradix.hooks.serving import at_result, before_forward
from vradix.testing.harness.cache_fixture import ForwardWrite
from vradix.request import UnstampedRequestError
from vradix.engine import attach
from vradix.testing.harness.cache_fixture import build_cache, seq



@pytest.fixture(params=["rust", "python"])
def env(request):
    fx = build_cache(request.param, 1, kv_tokens=1024)
    return fx, attach(fx.cache)


def vradix_attributes(req):
    return sorted(k for k in vars(req) if "vradix" in k)


# vradix keeps one state object on Req (user key, epoch, crossed, skip flag, history, spans), not one attribute each
def test_a_request_carries_one_vradix_state_object_through_its_life(env):
    fx, state = env
    a = fx.make_req(seq(10, 40) + [1], extra_key="tenant")
    state.admit_or_raise(a)
    assert vradix_attributes(a) == ["_vradix"]
    st = request.of(a)
    assert (st.user_key, st.epoch, st.crossed, st.kv_history) == ("tenant", 0, False, [(0, 0, None, state.weight_id)])
    fx.admit(a)
    fx.prefill(a)
    state.bump(fx.cache, [a], [], reason="test", label="v1")
    assert request.of(a) is st and st.crossed and len(st.kv_history) == 2
    fx.decode(a, 7)
    fx.finish(a)
    assert vradix_attributes(a) == ["_vradix"]


# an unstamped request fails closed at a match, never matched under "the current epoch" (a getattr default)
def test_an_unstamped_request_reaching_a_match_is_refused(env):
    fx, state = env
    req = fx.make_req(seq(10, 20) + [1])
    with pytest.raises(UnstampedRequestError, match="without an epoch binding"):
        common.match_kv_cache(req, fx.cache, req.origin_input_ids, max_prefix_len=len(req.origin_input_ids) - 1)


# the sample guard's log names the request whose row is corrupt (its position in the full batch, not the filtered list)
def test_the_sample_guard_names_the_request_whose_row_is_corrupt(env, caplog):
    fx, state = env
    state.guard.config = GuardConfig(verify="sample", sample_every=1)
    warm = fx.make_req(seq(10, 40) + [9])
    state.admit_or_raise(warm)
    fx.admit(warm)
    fx.prefill(warm)
    fx.finish(warm)
    reqs = []
    for i in range(2):  # two requests reusing the cached prefix; the first crosses a publication (checked against its own range)
        r = fx.make_req(seq(10, 40) + [i])
        state.admit_or_raise(r)
        assert fx.admit(r) == 40
        fx.prefill(r, checkpoint=False)
        reqs.append(r)
    request.of(reqs[0]).crossed = True
    r2t = fx.req_pool.req_to_token
    state.ledger.page_epoch[int(r2t[reqs[1].kv.req_pool_idx, 5])] = 7  # corrupt the second request's prefix
    batch = ForwardWrite(out_cache_loc=torch.empty(0, dtype=torch.int64), reqs=reqs,
                         prefix_lens=[r.prefix_len for r in reqs])
    with caplog.at_level(logging.ERROR, logger="vradix"):
        before_forward(fx.scheduler_view(), batch)
        at_result(fx.scheduler_view(), batch)
    assert state.guard.stats.violations_caught == 2  # both read the shared page, each checked against its own range
    assert f"request {reqs[1].rid} would read 1 of 40" in state.guard.stats.last_violation
    assert state.guard.stats.last_violation.endswith("detected only (sample mode)")
    assert all(r.discard_output_reason is None for r in reqs)  # sample mode only detects
    request.of(reqs[0]).crossed = False
    for r in reqs:
        fx.finish(r)
