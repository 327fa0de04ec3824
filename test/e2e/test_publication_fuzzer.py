"""The publication fuzzer (`vradix.testing.harness.fuzzer`): random traffic and random control requests (every
publication kind, pauses in each mode, flushes, relabels, `/set_internal_state` allowed and refused, HiCache storage
detach and attach), every exact response that crossed no control step equal to a stock server on the weights its label
names, and every bounded response that reused another weights' KV equal to stock on the cache state its spans
describe.

- `test_publication_fuzzer_short_seed` (`make test`): the session's pooled vradix server (default flags), 6
  publications, the pooled stock server as the oracle;
- `test_the_long_profile_draws_the_engines_of_several_processes_and_the_runtime_changes` (no server): the long
  profile's seed draws two data-parallel ranks and HiCache (its storage detach and attach), and the HTTP-workers
  dimension only when switched on;
- `test_publication_fuzzer_long_profile` (`make test-long`): `VRADIX_FUZZ_COMBINATIONS` (default 20) random supported
  flag combinations, each on its own server, `VRADIX_FUZZ_PUBLICATIONS` (default 25) publications each
  (`VRADIX_FUZZ_HTTP_WORKERS=1` draws two HTTP workers too); its figures are in docs/reliability.md.
"""
import dataclasses
import itertools
import os

import pytest

from vradix.testing.harness import fuzzer
from vradix.testing.models.llama import generate

pytestmark = [pytest.mark.e2e]


@pytest.fixture(scope="module")
def weights(models, tmp_path_factory):
    c = generate(str(tmp_path_factory.mktemp("fuzz") / "C"), seed=3, dtype="float32", init_range=0.2)
    return {"A": models[0], "B": models[1], "C": c}


def assert_clean(figures: fuzzer.Figures, publications: int) -> None:
    print(figures.line(), figures.counts)
    assert not figures.errors, figures.errors[:3]
    assert not figures.mismatches, figures.mismatches[:5]
    assert figures.publications >= publications and figures.checked > 0, figures.line()


def oracle_server(pool, path, combo: fuzzer.Combination):
    """A stock server with the combination's chunking and page size (the numerics a response depends on)."""
    return pool.lease(path, vradix=False, chunked_prefill_size=combo.chunked_prefill_size,
                      extra_args=["--page-size", str(combo.page_size)])


@pytest.mark.timeout(900)
def test_publication_fuzzer_short_seed(weights, server_pool, tmp_path):
    figures = fuzzer.fuzz(weights, str(tmp_path), seed=7, combinations=[fuzzer.Combination()], publications=6,
                          stock=lambda path, combo: server_pool.lease(path, vradix=False),
                          server=lambda combo: server_pool.lease(weights["A"]))
    assert_clean(figures, 6)


def long_profile_draws(http_workers: bool = False):
    draws = fuzzer.combinations(fuzzer.LONG_PROFILE_SEED, http_workers=http_workers)
    return list(itertools.islice(draws, fuzzer.LONG_PROFILE_COMBINATIONS))


@pytest.mark.timeout(60)
def test_the_long_profile_draws_the_engines_of_several_processes_and_the_runtime_changes():
    combos = long_profile_draws()
    dp2 = [c for c in combos if c.dp == 2]
    assert dp2 and all("--dp-size" in c.args() and c.env()["SGLANG_CPU_OMP_THREADS_BIND"] == "0|1" for c in dp2)
    # SGLang asserts DP = 1 for a tensor update
    assert all("bucketed tensor update" not in c.control_steps() for c in dp2)
    assert not any(c.hicache or c.sessions for c in dp2)
    hicache = [c for c in combos if c.hicache]
    assert hicache and all("storage detach or attach" in c.control_steps() and "--admin-api-key" in c.args()
                           for c in hicache)
    assert all({"internal state", "internal state refused"} <= set(c.control_steps()) for c in combos)
    assert all(c.http_workers == 1 for c in combos)
    switched = long_profile_draws(http_workers=True)
    assert any(c.http_workers == 2 and "--tokenizer-worker-num" in c.args() for c in switched)
    # the switch draws that dimension only: the rest of every combination is the same
    assert [dataclasses.replace(c, http_workers=1) for c in switched] == combos
    # the process dimensions leave every seed's flags as they were drawn before them
    import random
    rng = random.Random(fuzzer.LONG_PROFILE_SEED)
    assert [dataclasses.replace(c, dp=1, http_workers=1) for c in combos] == [fuzzer.draw_combination(rng)
                                                                               for _ in combos]


@pytest.mark.timeout(300)
def test_token_gaps_tell_the_weights_own_greedy_output_from_another_weights_output(weights, server_pool):
    """The near-tie recheck's measure on a real stock server: the weights' own greedy output is at their top choice
    at every token; another weights' output is far from it at its first token (a stale hit is never a near-tie)."""
    prompt = tuple(range(30, 130))
    with server_pool.lease(weights["B"], vradix=False) as s:
        other = tuple(s.generate(list(prompt), fuzzer.MAX_NEW_TOKENS)["output_ids"])
        s.reset(weights["A"], "A")
        own = tuple(s.generate(list(prompt), fuzzer.MAX_NEW_TOKENS)["output_ids"])
        assert own != other
        assert max(fuzzer.token_gaps(s, prompt, own)) <= fuzzer.NEAR_TIE_LOGPROB
        assert fuzzer.token_gaps(s, prompt, other)[0] > 10 * fuzzer.NEAR_TIE_LOGPROB


@pytest.mark.timeout(300)
def test_a_bounded_response_is_checked_against_the_stale_cache_state_its_spans_describe(weights, server_pool):
    """The bounded oracle on a real stock server: with spans A then B, the answer stock gives on A's prefix KV updated
    in place to B passes; B's answer from an empty cache (the same spans, but nothing stale reused) is a mismatch."""
    import random
    prefix = list(range(30, 126))
    prompt = tuple(prefix + [200, 201, 202])
    with server_pool.lease(weights["B"], vradix=False) as s:
        s.reset(weights["B"], "B")
        fresh = tuple(s.generate(list(prompt), fuzzer.MAX_NEW_TOKENS)["output_ids"])
        stale, cached = fuzzer.rebuilt_answer(s, weights, [("A", len(prefix))], "B", prompt)
    assert cached == len(prefix) and stale != fresh  # the oracle can tell them apart
    run = fuzzer.Run(server=None, rng=random.Random(0), prefixes=[prefix], bounded_server=True)
    run.label_weights.update({"vA": "A", "vB": "B"})
    spans = (("vA", 0, len(prefix)), ("vB", len(prefix), len(prompt) + fuzzer.MAX_NEW_TOKENS))
    for output in (stale, fresh):
        run.responses.append(fuzzer.Response(prompt, 0.0, 1.0, "vB", output, False, len(prefix), spans))
    figures = fuzzer.check(fuzzer.Combination(window=1), run, weights,
                           stock=lambda path, combo: server_pool.lease(path, vradix=False))
    assert (figures.checked, figures.bounded_rebuilt, figures.errors) == (2, 2, [])
    assert [m[3] for m in figures.mismatches] == [fresh] and not figures.near_ties


@pytest.mark.long
@pytest.mark.timeout(6 * 3600)
def test_publication_fuzzer_long_profile(weights, server_pool, tmp_path):
    import random
    n = int(os.environ.get("VRADIX_FUZZ_COMBINATIONS", fuzzer.LONG_PROFILE_COMBINATIONS))
    per = int(os.environ.get("VRADIX_FUZZ_PUBLICATIONS", fuzzer.LONG_PROFILE_PUBLICATIONS))
    seed = int(os.environ.get("VRADIX_FUZZ_SEED", fuzzer.LONG_PROFILE_SEED))
    combos = list(itertools.islice(fuzzer.combinations(seed, http_workers=os.environ.get(fuzzer.HTTP_WORKERS_ENV)
                                                       == "1"), n))
    figures = fuzzer.fuzz(weights, str(tmp_path), seed=random.Random(seed).randrange(1 << 30), combinations=combos,
                          publications=per, stock=lambda path, combo: oracle_server(server_pool, path, combo),
                          progress=lambda combo, so_far: print(f"[fuzz] {combo.name()}; so far {so_far.line()}",
                                                               flush=True))
    assert_clean(figures, n * per)
