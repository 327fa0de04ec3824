"""The RL rollout benchmark (the package benchmark/rl_rollout/, run as a folder): its stale-reuse and
ideal-work accounting on hand-built responses, its mode/server checks, and an E2E smoke run of all four modes on
real CPU servers so the script cannot rot."""
import json
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "benchmark", "rl_rollout")
sys.path.insert(0, os.path.join(ROOT, "benchmark"))

from rl_rollout.__main__ import parse_args, sized_to_schedule  # noqa: E402
from rl_rollout.client import Record  # noqa: E402
from rl_rollout.ideal import ideal_work  # noqa: E402
from rl_rollout.divergence import checkpoint_of_version, single_version, stale_by_staleness  # noqa: E402
from rl_rollout.modes import MODES  # noqa: E402
from rl_rollout.report import check_targets, write_png  # noqa: E402
from rl_rollout.schedule import Publication  # noqa: E402
from rl_rollout.shadow_cache import stale_reuse  # noqa: E402
from rl_rollout.trace import MIXED, output_tags, version_at  # noqa: E402

SYS = list(range(10, 30))      # a 20-token shared prefix
Q1, Q2 = [40, 41, 42], [50, 51, 52]


def rec(ids, out, cached, spans, fe, pf=None, fin=None, retractions=0, name="r"):
    """A Record as the benchmark builds it from /generate's meta_info (server timestamps)."""
    meta = {"cached_tokens": cached, "prompt_tokens": len(ids), "completion_tokens": len(out),
            "weight_versions": [{"version": v, "start": s, "end": e} for v, s, e in spans],
            "weight_version": spans[-1][0], "forward_entry_time": fe, "prefill_finished_time": pf or fe + 0.01,
            "request_finished_ts": fin or fe + 0.5, "num_retractions": retractions}
    return Record(name, 0, list(ids), list(out), meta)


def test_unsafe_reuse_of_a_prefix_cached_under_old_weights_is_counted():
    first = rec(SYS + Q1, [1, 2], 0, [("v0", 0, 2)], fe=1.0)
    # after a publication to v1 the server served the whole shared prefix from cache: nothing computed it under v1
    after = rec(SYS + Q2, [3, 4], len(SYS), [("v1", 0, 2)], fe=3.0)
    assert stale_reuse([first, after]) == {"stale_tokens_reused": len(SYS), "requests_with_stale_reuse": 1}


def test_reuse_of_a_prefix_recomputed_under_the_new_weights_is_not_counted():
    first = rec(SYS + Q1, [1, 2], 0, [("v0", 0, 2)], fe=1.0)
    recompute = rec(SYS + Q2, [3, 4], 0, [("v1", 0, 2)], fe=3.0)          # vradix: a miss after the publication
    hit = rec(SYS + Q2, [5, 6], len(SYS) + 2, [("v1", 0, 2)], fe=4.0)     # then a fresh hit
    assert stale_reuse([first, recompute, hit])["stale_tokens_reused"] == 0


def test_kv_computed_over_stale_context_is_stale_too():
    first = rec(SYS + Q1, [1, 2], 0, [("v0", 0, 2)], fe=1.0)
    stale_prefix = rec(SYS + Q2, [3, 4], len(SYS), [("v1", 0, 2)], fe=3.0)   # computes Q2 over v0 KV of SYS
    sibling = rec(SYS + Q2, [5, 6], len(SYS) + 2, [("v1", 0, 2)], fe=4.0)    # reuses SYS and that mixed Q2
    out = stale_reuse([first, stale_prefix, sibling])
    assert out == {"stale_tokens_reused": len(SYS) + len(SYS) + 2, "requests_with_stale_reuse": 2}


def test_a_copy_counts_only_once_it_could_be_in_the_tree():
    fresh = rec(SYS + Q2, [3, 4], 0, [("v1", 0, 2)], fe=3.0, pf=3.5)
    # matched at 2.9, before `fresh` started its prefill: the hit cannot have come from it
    early = rec(SYS + Q2, [5, 6], len(SYS), [("v1", 0, 2)], fe=2.9)
    # matched at 3.2, after its first (chunked) forward started: the chunk may have been checkpointed already
    late = rec(SYS + Q2, [5, 6], len(SYS), [("v1", 0, 2)], fe=3.2)
    assert stale_reuse([fresh, early])["stale_tokens_reused"] == len(SYS)
    assert stale_reuse([fresh, late])["stale_tokens_reused"] == 0
    # output positions only once the request finished (inserted at release)
    turn1 = rec(SYS, [1, 2, 3], 0, [("v1", 0, 3)], fe=1.0, fin=2.0)
    turn2_early = rec(SYS + [1, 2, 3, 9], [4], len(SYS) + 2, [("v1", 0, 1)], fe=1.5)
    assert stale_reuse([turn1, turn2_early])["stale_tokens_reused"] == 2


def test_output_kv_of_a_request_that_crossed_a_publication_is_mixed():
    # output token j's KV is computed with the weights that sampled token j+1; tokens 0-2 were sampled by v0
    assert output_tags([{"version": "v0", "start": 0, "end": 3}, {"version": "v1", "start": 3, "end": 6}],
                              6, clean=True) == ["v0", "v0", MIXED, MIXED, MIXED]
    assert output_tags([{"version": "v0", "start": 0, "end": 4}], 4, clean=False) == [MIXED] * 3
    # a later turn that resends that history reuses mixed KV: stale
    crossing = rec(SYS, [1, 2, 3, 4, 5, 6], 0, [("v0", 0, 3), ("v1", 3, 6)], fe=1.0, fin=2.0)
    turn2 = rec(SYS + [1, 2, 3, 4, 5, 6, 60], [7], len(SYS) + 5, [("v1", 0, 1)], fe=2.5)
    assert stale_reuse([crossing, turn2])["stale_tokens_reused"] == len(SYS) + 5


def test_retracted_requests_count_as_recomputed_under_each_later_version():
    retracted = rec(SYS + Q1, [1, 2, 3], 0, [("v0", 0, 1), ("v1", 1, 3)], fe=1.0, retractions=1)
    hit = rec(SYS + Q1, [4], len(SYS) + 3, [("v1", 0, 1)], fe=3.0)
    assert stale_reuse([retracted, hit])["stale_tokens_reused"] == 0
    # its first prefill (v0) stays matchable for requests admitted before the publication
    sibling = rec(SYS + Q1, [5], len(SYS) + 3, [("v0", 0, 1)], fe=1.5)
    assert stale_reuse([retracted, sibling])["stale_tokens_reused"] == 0


def test_a_request_is_judged_by_the_version_in_effect_when_it_matched():
    """Retracted (or chunk-crossing) before its first token: every output token is v1, but it matched under v0."""
    pub = Publication(1, "v1", "test", 1, boundary=2.0)
    first = rec(SYS + Q1, [1, 2], 0, [("v0", 0, 2)], fe=1.0)
    crossing = rec(SYS + Q2, [3, 4], len(SYS), [("v1", 0, 2)], fe=1.5, retractions=1)
    after = rec(SYS + Q2, [5, 6], len(SYS), [("v1", 0, 2)], fe=3.0)
    for r in (first, crossing, after):
        r.sent, r.received = r.meta["forward_entry_time"], r.meta["request_finished_ts"]
        r.meta["request_received_ts"], r.meta["response_sent_to_client_ts"] = r.sent, r.received
    out = stale_reuse([first, crossing, after], [pub], "v0")
    # `crossing` matched SYS under v0 (not stale); its recomputation is v1, so `after` reuses fresh KV
    assert out["stale_tokens_reused"] == 0
    assert version_at([2.0, 5.0], ["v0", "v1", "v2"], 1.0) == "v0"
    assert version_at([2.0, 5.0], ["v0", "v1", "v2"], 3.0) == "v1"
    assert version_at([2.0, 5.0], ["v0", "v1", "v2"], 6.0) == "v2"


# ---- the ideal correct engine (rl_rollout/ideal.py) ---------------------------------------------------------------------
N = len(SYS + Q1)   # 23 prompt tokens; an engine matches at most N - 1 of them


def test_ideal_engine_computes_a_shared_prompt_once_per_version():
    group = [rec(SYS + Q1, [1], 0, [("v0", 0, 1)], fe=1.0, pf=1.1, fin=1.2)] + \
            [rec(SYS + Q1, [1], N - 1, [("v0", 0, 1)], fe=2.0 + i, pf=2.1 + i) for i in range(3)]
    out = ideal_work(group)
    assert out["ideal_prompt_tokens"] == N + 3 * 1
    assert out["missed_tokens"] == 0 and out["cached_beyond_ideal_tokens"] == 0
    # after a publication nothing computed under v1 yet: the ideal engine recomputes the prompt once
    after = [rec(SYS + Q2, [2], 0, [("v1", 0, 1)], fe=5.0, pf=5.1),
             rec(SYS + Q2, [2], N - 1, [("v1", 0, 1)], fe=6.0, pf=6.1)]
    assert ideal_work(group + after)["ideal_prompt_tokens"] == N + 3 + N + 1


def test_missed_reuse_is_split_into_computed_earlier_and_in_flight():
    producer = rec(SYS + Q1, [1], 0, [("v0", 0, 1)], fe=1.0, pf=1.5)
    same_batch = rec(SYS + Q2, [1], 0, [("v0", 0, 1)], fe=1.0, pf=1.5)       # scheduled in the same forward
    next_batch = rec(SYS + Q1, [1], 0, [("v0", 0, 1)], fe=1.2, pf=1.8)       # producer's prefill not processed yet
    later = rec(SYS + Q1, [1], len(SYS), [("v0", 0, 1)], fe=2.0, pf=2.1)     # in the tree, matched only SYS
    out = ideal_work([producer, same_batch, next_batch, later])
    assert out["ideal_prompt_tokens"] == N + len(Q2) + 1 + 1
    assert out["missed_in_flight_tokens"] == len(SYS) + (N - 1) and out["missed_in_flight_requests"] == 2
    assert out["missed_same_batch_tokens"] == len(SYS)
    assert out["missed_earlier_tokens"] == N - 1 - len(SYS) and out["missed_earlier_requests"] == 1
    assert out["missed_tokens"] == out["missed_in_flight_tokens"] + out["missed_earlier_tokens"]
    # scheduled before the version's first prefill (the producer's) finished at 1.5: cold
    assert out["missed_cold_tokens"] == len(SYS) + (N - 1)
    work = sum(r.meta["prompt_tokens"] - r.meta["cached_tokens"]
               for r in (producer, same_batch, next_batch, later))
    assert work - out["ideal_prompt_tokens"] == out["missed_tokens"]


def test_ideal_engine_never_reuses_another_versions_or_mixed_kv():
    first = rec(SYS + Q1, [1, 2], 0, [("v0", 0, 2)], fe=1.0)
    stale = rec(SYS + Q2, [3], len(SYS), [("v1", 0, 1)], fe=3.0)             # the unsafe engine reused v0's SYS
    out = ideal_work([first, stale])
    assert out["ideal_prompt_tokens"] == N + N and out["cached_beyond_ideal_tokens"] == len(SYS)
    # a crossing request's output after the version change is MIXED: the next turn recomputes from there
    crossing = rec(SYS, [1, 2, 3, 4], 0, [("v0", 0, 2), ("v1", 2, 4)], fe=1.0, pf=1.1, fin=2.0)
    fresh = rec(SYS, [9], 0, [("v1", 0, 1)], fe=2.5, pf=2.6)                  # computes SYS under v1
    turn2 = rec(SYS + [1, 2, 3, 4, 60], [7], len(SYS), [("v1", 0, 1)], fe=3.0)
    assert ideal_work([crossing, fresh, turn2])["ideal_prompt_tokens"] == len(SYS) + len(SYS) + 5
    # its outputs under its own version are reusable once it finished, not before
    whole = rec(SYS, [1, 2, 3], 0, [("v0", 0, 3)], fe=1.0, pf=1.1, fin=2.0)
    assert ideal_work([whole, rec(SYS + [1, 2, 3, 60], [7], 0, [("v0", 0, 1)], fe=2.5)])["ideal_prompt_tokens"] \
        == len(SYS) + 2
    assert ideal_work([whole, rec(SYS + [1, 2, 3, 60], [7], 0, [("v0", 0, 1)], fe=1.5)])["ideal_prompt_tokens"] \
        == len(SYS) + 4


def test_a_retracted_request_counts_as_recomputed_under_each_version():
    # prefilled under v0, retracted after its first token, re-prefilled (prompt + that token) under v1
    retracted = rec(SYS + Q1, [1, 2, 3], 0, [("v0", 0, 1), ("v1", 1, 3)], fe=1.0, fin=2.0, retractions=1)
    other = rec(SYS + Q2, [5, 6], 0, [("v1", 0, 2)], fe=1.1, fin=2.0, retractions=1)   # retracted before a token
    hit = rec(SYS + Q1, [4], N - 1, [("v1", 0, 1)], fe=3.0)
    for r in (retracted, other, hit):   # client and server clocks agree
        r.sent, r.received = r.meta["forward_entry_time"], r.meta["request_finished_ts"]
        r.meta["request_received_ts"], r.meta["response_sent_to_client_ts"] = r.sent, r.received
    out = ideal_work([retracted, other, hit], [Publication(1, "v1", "test", 2, boundary=1.5)], "v0")
    # v0: both prompts (SYS once); v1 re-prefills: SYS + Q1 + [1], then Q2 over the same SYS; the hit: 1 token
    assert out["ideal_prompt_tokens"] == (N + len(Q2)) + (N + 1 + len(Q2)) + 1
    assert out["ideal_reprefill_tokens"] == N + 1 + len(Q2) and out["cached_beyond_ideal_tokens"] == 0


def test_a_schedule_sweep_reports_targets_per_schedule_and_plots_work_over_ideal(tmp_path):
    rows = [{"workload": "grpo", "mode": m, "publish_every": k, "prefill_computed": work, "ideal_prompt_tokens": 1000,
             "work_over_ideal": work / 1000, "reprefilled_tokens": 0, "reprefilled_per_publication": 0.0,
             "stale_tokens_reused": 0}
            for k, works in ((16, {"in_place": 900, "in_place+vradix": 1300}),
                             (256, {"in_place": 900, "in_place+vradix": 1050})) for m, work in works.items()]
    ideal = {t["publish_every"]: t["met"] for t in check_targets(rows, 8) if "ideal" in t["target"]}
    assert ideal == {16: False, 256: True}
    a = parse_args(["--publish-every-requests", "16,64,256", "--scale-to-schedule", "4"])
    assert a.publish_every_requests == [16, 64, 256]
    for k in a.publish_every_requests:   # N x K requests per run: N - 1 publications at every schedule
        sized = sized_to_schedule(a, k)
        assert sized.prompts * sized.samples == 4 * k and sized.sessions * sized.turns == 4 * k
    assert sized_to_schedule(parse_args([]), 16).prompts == 16
    assert write_png(rows, str(tmp_path / "sweep.png")) is None and (tmp_path / "sweep.png").stat().st_size > 0


def test_each_mode_refuses_a_server_started_for_another():
    stock = {"disable_radix_cache": False, "enable_metrics": True, "internal_states": [{}]}
    vradix = {**stock, "internal_states": [{"vradix": {"active": True}}]}
    off = {**stock, "disable_radix_cache": True}
    MODES["in_place"].check_server(stock)
    MODES["retract+flush"].check_server(stock)
    MODES["in_place+vradix"].check_server(vradix)
    MODES["radix-off"].check_server(off)
    for mode, info in (("in_place", vradix), ("in_place+vradix", stock), ("radix-off", stock),
                       ("retract+flush", off)):
        with pytest.raises(SystemExit, match=re.escape(f"does not match mode {mode!r}")):
            MODES[mode].check_server(info)
    with pytest.raises(SystemExit, match="--enable-metrics"):
        MODES["in_place"].check_server({**stock, "enable_metrics": False})


def test_a_bounded_mode_needs_a_server_with_its_window():
    def vradix(window):
        return {"disable_radix_cache": False, "enable_metrics": True,
                "internal_states": [{"vradix": {"active": True, "bounded_staleness": {"window": window}}}]}
    MODES["in_place+vradix(1)"].check_server(vradix(1))
    MODES["in_place+vradix"].check_server(vradix(0))
    assert MODES["in_place+vradix(2)"].server_flags() == ["--vradix-max-staleness", "2"]
    for mode, window in (("in_place+vradix(1)", 0), ("in_place+vradix(2)", 1), ("in_place+vradix", 2)):
        with pytest.raises(SystemExit, match="staleness window"):
            MODES[mode].check_server(vradix(window))


def test_divergence_scores_only_requests_that_ran_under_one_version():
    lp = {"output_token_logprobs": [[-0.5, 1, None], [-0.25, 2, None]]}
    before = rec(SYS + Q1, [1, 2], 0, [("v0", 0, 2)], fe=1.0, name="before")
    crossed = rec(SYS + Q2, [3, 4], 0, [("v0", 0, 1), ("v1", 1, 2)], fe=1.5, name="crossed")
    after = rec(SYS + Q2, [5, 6], 20, [("v1", 0, 2)], fe=3.0, name="after")
    late_span = rec(SYS + Q2, [7, 8], 0, [("v1", 0, 2)], fe=1.8, name="matched under v0, decoded under v1")
    no_lp = rec(SYS + Q1, [9, 9], 0, [("v1", 0, 2)], fe=3.5, name="no log-probs")
    for r in (before, crossed, after, late_span):
        r.meta.update(lp)
    pubs = [Publication(1, "v1", "requests", in_flight=1, boundary=2.0)]
    for r in (before, crossed, after, late_span, no_lp):   # one host: server and client clocks agree
        r.sent, r.received = r.meta["forward_entry_time"], r.meta["request_finished_ts"]
        r.meta["request_received_ts"] = r.sent
    got = [(r.task, v) for r, v in single_version([before, crossed, after, late_span, no_lp], pubs, "v0")]
    assert got == [("before", "v0"), ("after", "v1")]
    assert checkpoint_of_version(pubs + [Publication(2, "v2", "requests", 0, boundary=3.0)], "v0", ["A", "B"]) == \
        {"v0": "A", "v1": "B", "v2": "A"}
    after.meta["vradix_staleness"] = {"staleness": 1, "stale_tokens": 20}
    before.meta["vradix_staleness"] = {"staleness": 0, "stale_tokens": 0}
    assert stale_by_staleness([before, after, crossed]) == {"1": 20}


def test_bad_arguments_get_a_clear_error(capsys):
    for argv in (["--url", "http://x", "--mode", "in_place,radix-off"], ["--mode", "flush"],
                 ["--publish-every-requests", "0"], ["--publish-every-requests", "16,x"],
                 ["--response-tokens", "9,3"]):
        with pytest.raises(SystemExit):
            parse_args(argv)
    assert "exactly one --mode" in capsys.readouterr().err


@pytest.mark.e2e
@pytest.mark.long  # four CPU servers, one per mode: the benchmark's profile; the counting rules are tested above
@pytest.mark.timeout(900)
def test_smoke_all_modes_on_cpu_servers(tmp_path):
    """A few seconds of traffic per (mode, workload) on 3 CPU servers (the two stock modes share one)."""
    out = tmp_path / "rl.json"
    cmd = [sys.executable, SCRIPT, "--mode", "radix-off,retract+flush,in_place,in_place+vradix", "--prompts", "2", "--samples", "4", "--sessions", "2", "--turns", "3",
           "--concurrency", "4", "--publish-every-requests", "3", "--system-tokens", "64",
           "--question-tokens", "8,16", "--response-tokens", "4,8", "--tool-tokens", "4,8",
           "--workdir", str(tmp_path / "models"), "--json", str(out), "--png", str(tmp_path / "rl.png"),
           "--raw", str(tmp_path / "raw.jsonl")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.join(ROOT, "python"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=840, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert "| in_place+vradix |" in proc.stdout and "missed, in flight: tokens" in proc.stdout
    rows = {(r["workload"], r["mode"]): r for r in json.loads(out.read_text())["rows"]}
    assert len(rows) == 8
    for (workload, mode), r in rows.items():
        assert r["requests"] == (8 if workload == "grpo" else 6), (workload, mode)
        assert r["publications"] == (2 if workload == "grpo" else 1), (workload, mode)
        # the server's prefill counter and the client's accounting agree
        assert r["prefill_computed"] == r["prefill_computed_client"], (workload, mode)
        # the ideal correct engine on the same trace: computed, and no correct mode beats it
        assert 0 < r["ideal_prompt_tokens"] <= r["prompt_tokens"], (workload, mode)
        assert r["work_over_ideal"] == round(r["prefill_computed"] / r["ideal_prompt_tokens"], 3)
        if mode != "in_place":
            assert r["prefill_computed"] >= r["ideal_prompt_tokens"], (workload, mode, r)
            assert r["cached_beyond_ideal_tokens"] == 0, (workload, mode, r)
        if mode in ("in_place", "in_place+vradix"):   # extra work is exactly the missed reuse (no retraction)
            assert r["prefill_computed"] - r["ideal_prompt_tokens"] == \
                r["missed_tokens"] - r["cached_beyond_ideal_tokens"], (workload, mode, r)
            assert r["missed_tokens"] == r["missed_earlier_tokens"] + r["missed_in_flight_tokens"]
    for w in ("grpo", "agent"):
        assert rows[(w, "radix-off")]["cache_hit_rate"] == 0
        assert rows[(w, "radix-off")]["prefill_computed"] == rows[(w, "radix-off")]["prompt_tokens"]
        assert rows[(w, "in_place+vradix")]["stale_tokens_reused"] == 0
        assert rows[(w, "in_place+vradix")]["reprefilled_tokens"] == 0
        assert rows[(w, "in_place+vradix")]["cache_hit_rate"] > 0
        assert rows[(w, "retract+flush")]["stale_tokens_reused"] == 0
    # stock in_place: requests admitted after the publication reuse the system prompt cached under the old weights
    assert rows[("grpo", "in_place")]["stale_tokens_reused"] >= 64
    assert (tmp_path / "rl.png").exists() or "PNG: skipped" in proc.stdout
    # the accounting can be rerun from the raw dump without a server, and gives the same numbers
    re = subprocess.run([sys.executable, SCRIPT, "--reanalyze", str(tmp_path / "raw.jsonl"), "--json", str(out),
                         "--png", ""], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert re.returncode == 0, re.stderr[-3000:]
    again = {(r["workload"], r["mode"]): r for r in json.loads(out.read_text())["rows"]}
    for key in ("stale_tokens_reused", "ideal_prompt_tokens", "missed_tokens", "missed_in_flight_tokens"):
        assert {k: r[key] for k, r in again.items()} == {k: r[key] for k, r in rows.items()}, key


@pytest.mark.e2e
@pytest.mark.long  # two more CPU servers (one per window): the benchmark's profile
@pytest.mark.timeout(900)
def test_smoke_bounded_modes_on_cpu_servers(tmp_path):
    """The in_place+vradix(K) modes: bounded reuse is reported by staleness, and the divergence is scored."""
    out = tmp_path / "rl.json"
    cmd = [sys.executable, SCRIPT, "--mode", "in_place+vradix,in_place+vradix(1),in_place+vradix(2)",
           "--prompts", "2", "--samples", "4", "--sessions", "2", "--turns", "3", "--concurrency", "4",
           "--publish-every-requests", "3", "--system-tokens", "64", "--question-tokens", "8,16",
           "--response-tokens", "4,8", "--tool-tokens", "4,8", "--workdir", str(tmp_path / "models"),
           "--json", str(out), "--png", str(tmp_path / "rl.png")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.join(ROOT, "python"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=840, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert "the log-prob divergence it causes" in proc.stdout
    rows = {(r["workload"], r["mode"]): r for r in json.loads(out.read_text())["rows"]}
    for w in ("grpo", "agent"):
        exact, bounded = rows[(w, "in_place+vradix")], rows[(w, "in_place+vradix(1)")]
        assert exact["stale_tokens_by_staleness"] == {} and exact["stale_tokens_reused"] == 0
        assert exact["scored_tokens"] > 0 and exact["logprob_delta_p99"] < 0.05  # the scoring's numerical floor
        # the bounded server reuses the older system prompt: less work than exact, reported by staleness 1
        assert bounded["stale_tokens_by_staleness"].get("1", 0) >= 64
        assert bounded["prefill_computed"] < exact["prefill_computed"]
        assert bounded["older_kv_scored_tokens"] > 0


def test_sharegpt_keeps_the_complete_records_of_a_truncated_file():
    from rl_rollout.sharegpt import complete_records
    whole = '[{"id": "a", "conversations": []}, {"id": "b", "conversations": []}]'
    assert complete_records(whole) == ([{"id": "a", "conversations": []}, {"id": "b", "conversations": []}], False)
    cut = whole[:-20]  # mid-record, as the package's file ends
    assert complete_records(cut) == ([{"id": "a", "conversations": []}], True)


def test_a_sharegpt_session_appends_each_human_turn_after_the_models_reply():
    from argparse import Namespace
    from rl_rollout.sharegpt import alternating, session, token_ids
    a = Namespace(vocab=512, sharegpt_message_tokens=5, sharegpt_context=60, response_tokens=(2, 4))
    conv = [{"from": "human", "value": "one two three four five six seven"},
            {"from": "gpt", "value": "a"}, {"from": "human", "value": "why?"},
            {"from": "gpt", "value": "b c d e f g h"}]
    assert alternating(conv) and not alternating(conv[:2]) and not alternating(conv[1:])
    task = session("s", [7, 8], conv, a)
    assert task.prefix == [7, 8] + token_ids(conv[0]["value"], 512, 5) and len(task.prefix) == 7
    assert [(t.max_new_tokens, t.tool_result) for t in task.turns] == [(2, token_ids("why?", 512, 5)), (4, [])]
    assert all(3 <= t < 512 for t in task.prefix)
    a.sharegpt_context = 10  # the second turn would pass it: the session stops after the first
    assert [t.tool_result for t in session("s", [7, 8], conv, a).turns] == [[]]
