"""Mamba2 hybrid (NemotronH) on the CPU engine: the hybrid CPU aids against HF transformers' own torch reference ops,
and one E2E server with vradix on the tiny hybrid (greedy output == HF generate, a hybrid prefix hit, a publication
with a request crossing it, no stale reuse after it).

With `--mamba-radix-cache-strategy no_buffer` the recurrent state is snapshotted only where a request stopped (end of
prefill, or prompt+output-1 at finish), and a hit needs a state at exactly the matched node plus >= 1 token left to
compute: a prompt that *extends* an earlier prompt P hits at len(P); the same prompt sent twice does not hit.
"""
import pytest
import torch
from transformers.models.nemotron_h import modeling_nemotron_h as hf

from vradix import __version__
from vradix.testing.cpu_aids import hybrid
from vradix.testing.harness.hybrid_oracle import EXTENDED, EXTENDED_AGAIN, FORKED, NEW_TOKENS, PREFIX, SHORT, SIBLING
from vradix.testing.harness.scenario import StreamingRequest, pause_holding
from vradix.testing.harness.server import is_hybrid_model

DIM, WIDTH = 24, 4
NHEADS, HEADDIM, NGROUPS, DSTATE = 8, 4, 2, 6


def _conv_params(gen):
    return torch.randn(DIM, WIDTH, generator=gen), torch.randn(DIM, generator=gen)


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(0)


# ---- unit level: each stand-in against HF transformers' torch implementation ------------------------------------------
def test_causal_conv1d_fn_varlen_matches_hf(gen):
    """Two sequences back to back, the second continuing a cached window: each equals HF's conv on its own, and
    each slot ends holding that sequence's last width-1 inputs."""
    w, b = _conv_params(gen)
    x = torch.randn(DIM, 12, generator=gen)  # two sequences of 7 and 5
    states = torch.randn(3, DIM, WIDTH - 1, generator=gen)
    init = states[2].clone()
    out = hybrid.causal_conv1d_fn(x, w, b, query_start_loc=torch.tensor([0, 7, 12]), cache_indices=torch.tensor([0, 2]),
                                  has_initial_state=torch.tensor([False, True]), conv_states=states, activation="silu")
    ref0 = hf.causal_conv1d_fn(x[None, :, :7], w, b, activation="silu")[0]
    hf_state = init[None].clone()
    ref1 = hf.causal_conv1d_update(x[None, :, 7:], hf_state, w, b, activation="silu")[0]
    torch.testing.assert_close(out[:, :7], ref0)
    torch.testing.assert_close(out[:, 7:], ref1)
    torch.testing.assert_close(states[0], x[:, 4:7])
    torch.testing.assert_close(states[2], hf_state[0])


def test_causal_conv1d_update_matches_hf(gen):
    w, b = _conv_params(gen)
    states = torch.randn(4, DIM, WIDTH - 1, generator=gen)
    x = torch.randn(2, DIM, generator=gen)
    hf_states = states[[3, 1]].clone()
    out = hybrid.causal_conv1d_update(x, states, w, b, "silu", conv_state_indices=torch.tensor([3, 1]))
    ref = hf.causal_conv1d_update(x[..., None], hf_states, w, b, activation="silu")[..., 0]
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(states[[3, 1]], hf_states)


def _ssm_inputs(gen, T):
    return (torch.randn(1, T, NHEADS, HEADDIM, generator=gen), torch.randn(1, T, NHEADS, generator=gen),
            -torch.rand(NHEADS, generator=gen) - 0.1, torch.randn(1, T, NGROUPS, DSTATE, generator=gen),
            torch.randn(1, T, NGROUPS, DSTATE, generator=gen), torch.randn(NHEADS, generator=gen),
            torch.randn(NHEADS, generator=gen))


def test_chunk_scan_varlen_matches_hf_chunked_ssd(gen):
    """The per-token recurrence equals HF's chunked SSD algorithm (an independent formulation) per sequence, with
    and without an initial state, across chunk boundaries; the returned varlen states are HF's final states."""
    x, dt, A, B, C, D, dt_bias = _ssm_inputs(gen, 29)
    init = torch.randn(2, NHEADS, HEADDIM, DSTATE, generator=gen)
    init[0] = 0
    out = torch.empty_like(x)
    _, varlen, _ = hybrid.mamba_chunk_scan_combined(
        x, dt, A, B, C, chunk_size=8, D=D, dt_bias=dt_bias, initial_states=init, cu_seqlens=torch.tensor([0, 18, 29]),
        dt_softplus=True, out=out, return_varlen_states=True, return_track_states=True)
    for i, (s, e) in enumerate([(0, 18), (18, 29)]):
        ref, ref_final = hf.mamba2_chunk_scan(x[:, s:e], dt[:, s:e], A, B[:, s:e], C[:, s:e], 8, D=D, dt_bias=dt_bias,
                                              initial_states=init[i:i + 1], dt_softplus=True, return_final_states=True)
        torch.testing.assert_close(out[:, s:e], ref, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(varlen[i], ref_final[0], rtol=1e-4, atol=1e-4)
    with pytest.raises(NotImplementedError):  # extra_buffer's state tracking is not stood in for
        hybrid.mamba_chunk_scan_combined(x, dt, A, B, C, 8, cu_seqlens=torch.tensor([0, 29]), return_varlen_states=True,
                                         return_track_states=True, track_seq_idx=torch.tensor([0]),
                                         track_end_locs=torch.tensor([5]))


def test_selective_state_update_matches_hf(gen):
    """One decode step in the layout both SGLang's and HF's mixers pass (dt/A/D/dt_bias expanded per head dim)
    equals HF's step; only the indexed state rows move."""
    x, dt, A, B, C, D, dt_bias = _ssm_inputs(gen, 2)
    x, B, C = x[0], B[0], C[0]  # batch of 2 decode tokens
    dt, A = dt[0][..., None].expand(-1, -1, HEADDIM), A[:, None, None].expand(-1, HEADDIM, DSTATE)
    D, dt_bias = D[:, None].expand(-1, HEADDIM), dt_bias[:, None].expand(-1, HEADDIM)
    state = torch.randn(5, NHEADS, HEADDIM, DSTATE, generator=gen)
    before, hf_state = state.clone(), state[[4, 0]].clone()
    out = torch.empty_like(x)
    hybrid.selective_state_update(state, x, dt, A, B, C, D, dt_bias=dt_bias, dt_softplus=True,
                                  state_batch_indices=torch.tensor([4, 0]), out=out)
    ref = hf.mamba2_selective_state_update(hf_state, x, dt, A, B, C, D=D, dt_bias=dt_bias, dt_softplus=True)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(state[[4, 0]], hf_state, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(state[1:4], before[1:4])


def test_prefill_then_decode_equals_one_scan(gen):
    """The state the prefill stand-ins leave in the slots, continued by the decode stand-ins, gives HF's output for
    the whole sequence (the path a cached prefix takes: prefill, snapshot, continue)."""
    w, b = _conv_params(gen)
    xc = torch.randn(DIM, 10, generator=gen)
    conv_states = torch.zeros(1, DIM, WIDTH - 1)
    pre = hybrid.causal_conv1d_fn(xc[:, :7], w, b, query_start_loc=torch.tensor([0, 7]),
                                  cache_indices=torch.tensor([0]), has_initial_state=torch.tensor([False]),
                                  conv_states=conv_states, activation="silu")
    dec = [hybrid.causal_conv1d_update(xc[None, :, t], conv_states, w, b, "silu",
                                       conv_state_indices=torch.tensor([0]))[0] for t in range(7, 10)]
    whole = hf.causal_conv1d_fn(xc[None], w, b, activation="silu")[0]
    torch.testing.assert_close(torch.cat([pre, torch.stack(dec, -1)], -1), whole)


def test_apply_binds_the_stand_ins_and_import_time_names():
    hybrid.apply()
    from sglang.srt.layers.attention.mamba import mamba
    from sgl_kernel.mamba import causal_conv1d_fn_cpu, chunk_gated_delta_rule_cpu

    assert mamba.causal_conv1d_fn is hybrid.causal_conv1d_fn and mamba.causal_conv1d_update_triton is \
        hybrid.causal_conv1d_update
    assert mamba.mamba_chunk_scan_combined is hybrid.mamba_chunk_scan_combined
    assert mamba.selective_state_update is hybrid.selective_state_update
    assert causal_conv1d_fn_cpu is hybrid.causal_conv1d_fn
    with pytest.raises(NotImplementedError):
        chunk_gated_delta_rule_cpu()
    with pytest.raises(NotImplementedError):
        torch.ops.sgl_kernel.fused_gdn_gating_cpu(torch.zeros(1))


# ---- E2E: a CPU server with vradix on the tiny hybrid ---------------------------------------------------------------------
# `hybrid_models` and `hf_greedy` (HF's greedy outputs on A and B) are session fixtures in conftest.py


def publish(server, weights: str) -> StreamingRequest:
    """An in_place publication of `weights` as version "B" (no flush) with a request running across it; returns
    that request."""
    (crossing,) = pause_holding(server, lambda: [StreamingRequest(server.url, SHORT, 40)])
    server.update_weights(weights, "B", flush=False)
    assert server.post("/continue_generation", {}).status_code == 200
    return crossing


#: the two E2E servers on hybrid A: stock, and vradix
HYBRID_SERVERS = {"stock": dict(vradix=False, max_total_tokens=4096, startup_timeout=400),
                  "vradix": dict(max_total_tokens=4096, startup_timeout=400)}


@pytest.fixture(scope="module")
def hybrid_servers(hybrid_models, server_pool):
    """Start both E2E servers together, parked in the pool until their test; `hybrid_servers(name)` leases one (a
    fresh process, stopped after its test)."""
    server_pool.prestart(*[(hybrid_models[0], kw) for kw in HYBRID_SERVERS.values()])
    return lambda name: server_pool.lease(hybrid_models[0], once=True, **HYBRID_SERVERS[name])


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_stock_sglang_reuses_stale_hybrid_state_after_publication(hybrid_models, hf_greedy, hybrid_servers):
    """The bug on a hybrid: stock SGLang inserts a crossing request's mixed A/B span and keeps serving the KV and
    recurrent state computed under A after B is published, labelled B."""
    a, b = hybrid_models
    with hybrid_servers("stock") as s:
        s.generate(EXTENDED, NEW_TOKENS)
        final = publish(s, b).result()
        crossed_span = SHORT + final["output_ids"][:-1]  # snapshotted at finish: the crossing request inserted it
        assert s.generate(crossed_span + [7], 1)["meta_info"]["cached_tokens"] == len(crossed_span)
        r = s.generate(EXTENDED_AGAIN, NEW_TOKENS)
        assert r["meta_info"]["cached_tokens"] == len(EXTENDED) and r["meta_info"]["weight_version"] == "B"
        assert r["output_ids"] != hf_greedy["B", tuple(EXTENDED_AGAIN)]


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_vradix_hybrid_server_matches_hf_hits_prefixes_and_never_reuses_stale_state(hybrid_models, hf_greedy,
                                                                                    hybrid_servers):
    a, b = hybrid_models
    assert is_hybrid_model(a)
    with hybrid_servers("vradix") as s:
        logs = s.logs()
        assert f"vradix {__version__} active" in logs and "hybrid_ssm=True" in logs, s.tail()

        def gen(prompt):
            r = s.generate(prompt, NEW_TOKENS)
            return r["output_ids"], r["meta_info"]["cached_tokens"]

        # greedy output equals HF's on the same weights
        assert gen(SHORT) == (hf_greedy["A", tuple(SHORT)], 0)
        assert gen(PREFIX) == (hf_greedy["A", tuple(PREFIX)], 0)
        # hybrid prefix hit: a prompt extending PREFIX reuses its KV and recurrent state
        assert gen(EXTENDED) == (hf_greedy["A", tuple(EXTENDED)], len(PREFIX))
        # a different prompt sharing PREFIX hits too (PREFIX's own request left a state at its end)
        assert gen(SIBLING) == (hf_greedy["A", tuple(SIBLING)], len(PREFIX))
        # ...but no_buffer keeps no state at a fork point no request stopped at: siblings of an unsent prefix miss
        assert [gen(p)[1] for p in FORKED] == [0, 0]

        # publication with a request crossing it: EXTENDED's state (under A) would give a hit of len(EXTENDED)
        crossing = publish(s, b)
        out, cached = gen(EXTENDED_AGAIN)
        assert cached == 0 and out == hf_greedy["B", tuple(EXTENDED_AGAIN)]
        final = crossing.result()
        assert final["meta_info"]["num_retractions"] == 0 and final["meta_info"]["completion_tokens"] == 40
        # the crossing request published none of its (mixed A/B) KV or state: no_buffer would have snapshotted it at
        # prompt+output-1, which a prompt extending that span would hit
        crossed_span = SHORT + final["output_ids"][:-1]
        assert s.generate(crossed_span + [7], 1)["meta_info"]["cached_tokens"] == 0
        # sharing resumes under B: EXTENDED_AGAIN's new state serves a prompt extending it
        again = EXTENDED_AGAIN + [51]
        r = s.generate(again, 1)
        assert r["meta_info"]["cached_tokens"] == len(EXTENDED_AGAIN)
        v = s.vradix_info()
        assert v["epoch"] == 1 and v["publications"] == 1 and v["stale_tokens_pinned"] == 0, v


# ---- cache level: a publication frees the stale recurrent states ------------------------------------------------------
@pytest.mark.parametrize("locked", [False, True], ids=["idle-engine", "node-locked"])
def test_a_publication_frees_the_stale_recurrent_states_of_a_hybrid_tree(monkeypatch, locked):
    """SGLang's test-kit hybrid cache (FULL + MAMBA, page size 1, real `HybridReqToTokenPool`): stale nodes hold KV
    and a recurrent state each, and a bump frees both: when nothing holds KV (an idle engine, e.g. a P/D prefill role
    whose requests all finished: the bump drops the whole tree) and when a request's lock pins one stale node (that
    node keeps its state until released). SGLang's idle check counts a state slot that neither the tree nor a request
    holds as leaked, and kills the scheduler."""
    from array import array

    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.mem_cache.base_prefix_cache import InsertParams
    from sglang.srt.mem_cache.radix_cache import RadixKey
    from sglang.srt.mem_cache.unified_cache.components.base import ComponentType
    from sglang.srt.sampling.sampling_params import SamplingParams
    from sglang.test.kits.unified_radix_cache import fixtures
    from sglang.test.kits.unified_radix_cache.config import CacheConfig

    from vradix import identity
    from vradix.engine import attach
    from vradix.testing.harness.cache_fixture import seq

    monkeypatch.setattr(fixtures, "get_device", lambda: "cpu")  # the kit builds on the accelerator it finds
    cache, allocator, req_pool = fixtures.build_fixture(
        CacheConfig(components=(ComponentType.FULL, ComponentType.MAMBA), mamba_cache_size=8), tree_core_backend="python")
    state = attach(cache, with_ledger=False)
    states = req_pool.mamba_allocator
    states_total, kv_total = states.available_size(), allocator.available_size()

    def insert(tokens, epoch):
        """A finished request's prompt and its recurrent state (the tree takes the request's state slot)."""
        req = Req(rid=f"r{len(tokens)}", origin_input_text="", origin_input_ids=array("q"),
                  sampling_params=SamplingParams(temperature=0, max_new_tokens=1))
        req_pool.alloc([req])
        key = RadixKey(array("q", tokens), extra_key=identity.stamped(state.prefix_of_epoch(epoch), None))
        return cache.insert(InsertParams(key=key, value=allocator.alloc(len(tokens)),
                                         mamba_value=req.kv.mamba_pool_idx.unsqueeze(0))).last_device_node

    insert(seq(10, 12), 0)
    insert(seq(10, 12) + seq(90, 4), 0)
    pinned = insert(seq(500, 6), 0)
    assert states.available_size() == states_total - 3
    if locked:
        cache.lock(pinned)  # a crossing request's hold on a stale node
    state.bump(cache, [], [], reason="test")
    assert cache.evictable_size() == 0 and allocator.available_size() == kv_total - 6 * locked
    assert states.available_size() == states_total - locked, "a stale node's recurrent state was not freed"
