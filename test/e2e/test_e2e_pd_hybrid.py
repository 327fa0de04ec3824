"""E2E: a Mamba2 hybrid (the tiny NemotronH) on a real prefill/decode pair (CPU engine, hybrid CPU aids on both roles,
real KV *and* recurrent-state transfer over `mooncake_tcp`, the real P/D router; `vradix.testing.harness.pd`), vradix on both
roles, decode's radix cache on. The oracle is HF transformers' greedy generate (`vradix.testing.harness.hybrid_oracle`).

Contract: the canonical cached state of a prefix (decode's tree) lives in its own slot; the live state a request
receives from prefill lands in the request's own slot and is never overwritten by it; a request crossing a
publication keeps its live state and publishes none of it.
- the recurrent state travels: the pair's greedy output equals HF's (decode cannot compute a prompt; it continues from
  the state prefill sent);
- a decode prefix hit on a prompt extending an earlier one (`pd_spans` shows `decode_cache`) equals HF, and a second,
  different extension of the same prefix still hits and equals HF;
- an in_place publication on both roles with a hybrid request decoding across it: it finishes with 0 retractions, its
  decode span is split A/B, and decode publishes none of its mixed state (a prompt extending its span misses, while
  the same probe after a request finished under B hits); requests after it equal HF on B, hybrid hits included.
One pair for the module (`no_buffer`: a prompt extending an earlier prompt P hits at len(P); see `hybrid_oracle`).
"""
import pytest

from vradix.testing.harness import pd
from vradix.testing.harness.hybrid_oracle import EXTENDED, EXTENDED_AGAIN, NEW_TOKENS, PREFIX, SHORT, SIBLING
from vradix.testing.harness.reliability import wait_until
from vradix.testing.harness.scenario import StreamingRequest, pause_holding

MISSING = pd.missing_requirements()
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900),
              pytest.mark.skipif(bool(MISSING), reason="P/D kit needs: " + ", ".join(MISSING))]

#: tokens the crossing request decodes: enough that it is still decoding when the pause lands
CROSSING_TOKENS = 80


@pytest.fixture(scope="module")
def hybrid_pair(hybrid_models):
    """vradix on both roles, decode radix cache on, on hybrid weights A (the hybrid CPU aids load on both roles)."""
    with pd.PdPair(hybrid_models[0], vradix=True, startup_timeout=500) as p:
        yield p


def decode_hit(response) -> int:
    """How many prompt tokens decode served from its own cache (the `decode_cache` span of `pd_spans`)."""
    spans = response["meta_info"]["pd_spans"]
    return next((s["end"] for s in spans if s["role"] == "decode_cache"), 0)


def ask(pair, prompt, new_tokens=NEW_TOKENS):
    """(output ids, decode's cache hit) of `prompt` through the router."""
    r = pair.generate(prompt, new_tokens)
    return r["output_ids"], decode_hit(r)


def weight_id(server) -> str:
    return server.vradix_info()["weight_id"]


def test_both_roles_serve_the_hybrid_and_the_recurrent_state_travels(hybrid_pair, hf_greedy):
    pair = hybrid_pair
    for server in (pair.prefill, pair.decode):
        assert "hybrid_ssm=True" in server.logs(), server.tail()
    r = pair.generate(SHORT, NEW_TOKENS)
    assert r["output_ids"] == hf_greedy["A", tuple(SHORT)], r
    ids = {s["weight_id"] for s in r["meta_info"]["pd_spans"]}
    assert [s["role"] for s in r["meta_info"]["pd_spans"]] == ["prefill", "decode"] and ids == {weight_id(pair.decode)}


def test_a_decode_prefix_hit_keeps_the_cached_state_apart_from_the_transferred_one(hybrid_pair, hf_greedy):
    """PREFIX leaves a state at len(PREFIX) in decode's tree. EXTENDED hits it on decode, receives its live state
    (after len(EXTENDED) tokens) from prefill, and equals HF: the cached state did not overwrite the live one. SIBLING,
    another extension, still hits at len(PREFIX) after that and equals HF: the live state did not take the cached
    prefix's slot."""
    pair = hybrid_pair
    assert ask(pair, PREFIX) == (hf_greedy["A", tuple(PREFIX)], 0)
    r = pair.generate(EXTENDED, NEW_TOKENS)
    assert r["output_ids"] == hf_greedy["A", tuple(EXTENDED)], r
    assert decode_hit(r) == len(PREFIX) and r["meta_info"]["cached_tokens"] == len(PREFIX), r["meta_info"]
    assert ask(pair, SIBLING) == (hf_greedy["A", tuple(SIBLING)], len(PREFIX))


def test_a_hybrid_request_crossing_a_publication_on_both_roles_publishes_none_of_its_state(hybrid_pair, hybrid_models,
                                                                                          hf_greedy):
    pair = hybrid_pair
    a_id = weight_id(pair.decode)
    ask(pair, EXTENDED)  # decode's tree holds EXTENDED's state under A: a stale hit of len(EXTENDED) after B
    (crossing,) = pause_holding(pair.decode, lambda: [StreamingRequest(pair.url, SHORT, CROSSING_TOKENS)],
                                pause=lambda: pair.pause("in_place"), resume=pair.resume, what="the crossing request")
    pair.update_and_resume(hybrid_models[1], "B")
    b_id = weight_id(pair.decode)
    assert b_id != a_id and weight_id(pair.prefill) == b_id

    assert ask(pair, EXTENDED_AGAIN) == (hf_greedy["B", tuple(EXTENDED_AGAIN)], 0)  # nothing of A's state reused
    final = crossing.result(180)
    meta = final["meta_info"]
    assert meta["completion_tokens"] == CROSSING_TOKENS and meta["num_retractions"] == 0, meta
    assert [s["weight_id"] for s in meta["pd_spans"] if s["role"] == "decode"] == [a_id, b_id], meta["pd_spans"]
    # no_buffer snapshots a finished request's state at prompt+output-1: the crossing request's span would be a hit
    crossed_span = SHORT + final["output_ids"][:-1]
    assert ask(pair, crossed_span + [7], 1)[1] == 0
    # ...as the span of a request that finished under B is (the same probe can fail)
    finished_span = EXTENDED_AGAIN + hf_greedy["B", tuple(EXTENDED_AGAIN)][:-1]
    assert ask(pair, finished_span + [7], 1)[1] == len(finished_span)

    # sharing resumes under B: a hybrid prefix hit on decode equals HF on B
    assert ask(pair, PREFIX) == (hf_greedy["B", tuple(PREFIX)], 0)
    assert ask(pair, SIBLING) == (hf_greedy["B", tuple(SIBLING)], len(PREFIX))
    for server in (pair.prefill, pair.decode):  # a response may reach the client just before its KV is released
        wait_until(lambda: server.vradix_info()["crossing_requests"] == 0, 30, "crossing requests released")
        info = server.vradix_info()
        assert info["stale_tokens_pinned"] == 0 and info["publications"] == 1, info
