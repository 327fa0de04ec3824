"""E2E: a streaming session (`--enable-streaming-session`, SGLang's multi-turn agent path) across an in_place
publication, on real SGLang CPU servers with tiny float32 models. Turn 1 runs on weights A, B is published in place
(no flush), turn 2 follows. Stock SGLang lends turn 2 the session slot's KV computed under A; vradix re-prefills the
history under B. The oracle is the whole history on B as a fresh stock server answers it (`fresh_stock_outputs`'s
method: a stock server that loaded B with an idle flush, which resets its whole cache)."""
import pytest

from vradix.testing.harness.server import CpuServer, start_servers

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(400)]

SESSION_ARGS = ["--enable-streaming-session"]
TURN1 = [(i * 7) % 400 + 20 for i in range(64)]
TURN2 = [33, 44, 55]
TURN3 = [66, 77]
NEW_TOKENS = 4


def open_streaming_session(server) -> str:
    r = server.post("/open_session", {"capacity_of_str_len": 1 << 16, "streaming": True})
    assert r.status_code == 200, r.text
    return r.json()


def turn(server, session_id: str, tokens) -> dict:
    return server.generate(tokens, NEW_TOKENS, session_params={"id": session_id})


def publish_in_place(server, model: str) -> None:
    """What an RL trainer does: pause in place, load the new weights without a flush, continue."""
    server.pause("in_place")
    server.update_weights(model, "v2", flush=False)
    server.resume()


def session_across_publication(server, new_model: str) -> dict:
    """Turn 1, an in_place publication, turn 2, turn 3: each turn's answer."""
    sid = open_streaming_session(server)
    out = {"t1": turn(server, sid, TURN1)}
    publish_in_place(server, new_model)
    out["t2"] = turn(server, sid, TURN2)
    out["t3"] = turn(server, sid, TURN3)
    assert server.post("/close_session", {"session_id": sid}).status_code == 200
    return out


def test_streaming_session_turn_after_publication_is_computed_under_the_new_weights(models):
    stock, vr = start_servers(lambda: CpuServer(models[0], vradix=False, extra_args=SESSION_ARGS),
                              lambda: CpuServer(models[0], extra_args=SESSION_ARGS))
    try:
        got = {"stock": session_across_publication(stock, models[1]),
               "vradix": session_across_publication(vr, models[1])}
        info = vr.vradix_info()
        # the oracle: a stock server that loaded B with an idle flush answers each turn's whole history afresh
        stock.reset(models[1], "B")
        t1 = got["vradix"]["t1"]["output_ids"]
        assert got["stock"]["t1"]["output_ids"] == t1  # both served turn 1 on A
        history2 = TURN1 + t1 + TURN2
        oracle2 = stock.generate(history2, NEW_TOKENS)["output_ids"]
        t2 = got["vradix"]["t2"]
        oracle3 = stock.generate(history2 + t2["output_ids"] + TURN3, NEW_TOKENS)["output_ids"]
    finally:
        stock.stop()
        vr.stop()

    # stock: turn 2 reuses the slot's KV computed under A (its whole committed history) under B's label
    s2 = got["stock"]["t2"]
    assert s2["meta_info"]["cached_tokens"] >= len(TURN1) and s2["meta_info"]["weight_version"] == "v2"
    assert s2["output_ids"] != oracle2, "stock should have served old-weight session KV"
    # vradix: turn 2 re-prefills the whole history under B, exactly as a fresh server on B answers it
    assert t2["meta_info"]["cached_tokens"] == 0 and t2["output_ids"] == oracle2
    prefix = t2["meta_info"]["prefix_cache"]
    assert prefix["epoch"] == 1 and prefix["weight_version"] == "v2"
    # and turn 3, in the same epoch, borrows the slot again (exact reuse), still equal to the fresh answer
    t3 = got["vradix"]["t3"]
    assert t3["meta_info"]["cached_tokens"] >= len(history2) and t3["output_ids"] == oracle3
    assert info["session_slots_released"] == 1 and info["kv_ledger"]["violations_caught"] == 0


RADIX_OFF_SESSION_ARGS = ["--disable-radix-cache", "--enable-streaming-session"]


def test_without_a_radix_cache_stock_lends_old_weights_session_kv_and_vradix_refuses_the_pair(models, server_pool,
                                                                                             monkeypatch):
    """`--disable-radix-cache` keeps no KV across requests, except in a streaming session's slot: SGLang lends the
    slot's record before it checks that the tree is disabled. Stock SGLang (the oracle that the hole exists) answers
    turn 2 after an in_place publication of B on turn 1's A-KV, unlike the whole history on B. vradix runs treeless
    there (no epochs), so it refuses the pair at launch, naming the alternative."""
    from sglang.srt.server_args import prepare_server_args

    from vradix.closed_world import unversioned

    with server_pool.lease(models[0], vradix=False, extra_args=RADIX_OFF_SESSION_ARGS) as stock:
        sid = open_streaming_session(stock)
        t1 = turn(stock, sid, TURN1)["output_ids"]
        publish_in_place(stock, models[1])
        t2 = turn(stock, sid, TURN2)
        assert stock.post("/close_session", {"session_id": sid}).status_code == 200
        stock.reset(models[1], "B")
        oracle2 = stock.generate(TURN1 + t1 + TURN2, NEW_TOKENS)["output_ids"]  # no tree: computed afresh on B
    assert t2["meta_info"]["cached_tokens"] >= len(TURN1), "the slot did not lend turn 1's KV"
    assert t2["output_ids"] != oracle2, "stock should have served turn 1's A-KV under B"

    monkeypatch.setenv("SGLANG_USE_CPU_ENGINE", "1")
    args = prepare_server_args(["--model-path", models[0], "--device", "cpu", "--attention-backend", "torch_native",
                                "--skip-tokenizer-init", *RADIX_OFF_SESSION_ARGS])
    args.resolve_once()
    with pytest.raises(unversioned.UnversionedPathError, match="--disable-radix-cache.*radix cache on"):
        args.check_server_args()


L3_SESSION_ARGS = ["--enable-streaming-session", "--page-size", "4"]


def test_with_an_l3_backend_stock_stops_at_a_sessions_second_turn_and_vradix_refuses_the_pair(models, tmp_path,
                                                                                            monkeypatch):
    """SGLang 0.5.23's L3 prefetch reads a streaming turn's `last_host_node`, the session slot's `_VirtualNode`,
    as a tree node: stock SGLang with an L3 storage backend answers a session's first turn and its scheduler stops
    at the second. vradix refuses the pair at launch, naming the alternative."""
    from sglang.srt.server_args import prepare_server_args

    from vradix.closed_world import unversioned
    from vradix.testing.cpu_aids import HICACHE_CPU_FLAGS
    from vradix.testing.harness.hicache_store import HICACHE_ARGS, hicache_server
    from vradix.testing.harness.reliability import wait_until

    store = tmp_path / "l3"
    store.mkdir()
    with hicache_server(models[0], str(store), vradix=False, max_total_tokens=512, extra_args=L3_SESSION_ARGS) as s:
        sid = open_streaming_session(s)
        assert len(turn(s, sid, TURN1)["output_ids"]) == NEW_TOKENS
        with pytest.raises(Exception):
            turn(s, sid, TURN2)
        wait_until(lambda: "'_VirtualNode' object cannot be interpreted as an integer" in s.logs(), 60,
                   "the scheduler's TypeError in the log")

    monkeypatch.setenv("SGLANG_USE_CPU_ENGINE", "1")
    args = prepare_server_args(["--model-path", models[0], "--device", "cpu", "--attention-backend", "torch_native",
                                "--skip-tokenizer-init", *HICACHE_ARGS, *HICACHE_CPU_FLAGS, *L3_SESSION_ARGS])
    args.resolve_once()
    with pytest.raises(unversioned.UnversionedPathError, match="--hicache-storage-backend.*host tier only"):
        args.check_server_args()
