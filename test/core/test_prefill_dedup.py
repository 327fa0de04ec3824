"""Prefill dedup at cache level (`vradix.core.dedup`): which pending prefixes hold a candidate back, on real
SGLang requests matched against the real UnifiedRadixCache. The E2E check (a server computes a shared uncached prefix
once) is `test_e2e_server.py::test_vradix_publication_never_reuses_stale_prefix`."""
import pytest

from vradix import settings
from vradix.core import dedup
from vradix.engine import attach
from vradix.testing.harness.cache_fixture import build_cache

PREFIX = [(i * 7) % 400 + 3 for i in range(96)]


@pytest.fixture
def fx():
    f = build_cache("rust")
    f.state = attach(f.cache)
    return f


def stamped(fx, tokens):
    req = fx.make_req(tokens)
    fx.state.admit_or_raise(req)
    return req


def matched(fx, req):
    from sglang.srt.mem_cache import common
    common.match_kv_cache(req, fx.cache, req.origin_input_ids, max_prefix_len=len(req.origin_input_ids) - 1)
    return req


def test_a_candidate_sharing_a_pending_uncached_prefix_is_held_back_once_per_pass(fx):
    p, stats = dedup.Pass(threshold=32), dedup.DedupStats()
    first = stamped(fx, PREFIX + [1, 2])
    p.add(first)
    second = matched(fx, stamped(fx, PREFIX + [3, 4]))
    assert dedup.should_hold_back(p, second, stats)
    assert (stats.deferred, stats.deferred_shared_tokens) == (1, 96)
    short = matched(fx, stamped(fx, PREFIX[:20] + [5] * 40))
    assert not dedup.should_hold_back(p, short, stats)  # 20 shared tokens: below the threshold


def test_what_the_candidate_has_cached_does_not_count_as_shared(fx):
    warm = stamped(fx, PREFIX[:80] + [9])
    fx.admit(warm)
    fx.prefill(warm)
    fx.finish(warm)
    p = dedup.Pass(threshold=32)
    p.add(stamped(fx, PREFIX + [1]))
    cand = matched(fx, stamped(fx, PREFIX + [2]))
    assert cand.prefix_len == 80
    assert p.shared_uncached(cand) == 16  # only 16 of the 96 shared tokens are still to compute
    assert not dedup.should_hold_back(p, cand, dedup.DedupStats())


def test_other_namespaces_and_requests_that_will_not_insert_hold_nobody_back(fx):
    p = dedup.Pass(threshold=32)
    crossing = stamped(fx, PREFIX + [1])
    fx.state.bump(fx.cache, [], [], reason="test")  # crossing's namespace is now an older epoch's
    p.add(crossing)
    barred = stamped(fx, PREFIX + [2])
    barred.skip_radix_cache_insert = True  # e.g. the strict guard recomputes it as a miss and bars its insert
    p.add(barred)
    salted = stamped(fx, PREFIX + [3])
    salted.cache_salt = "tenant-b"
    p.add(salted)
    cand = matched(fx, stamped(fx, PREFIX + [4]))
    assert p.shared_uncached(cand) == 0


def test_a_bad_setting_is_refused(monkeypatch):
    monkeypatch.setenv("VRADIX_PREFILL_DEDUP", "maybe")
    with pytest.raises(settings.SettingsError, match="VRADIX_PREFILL_DEDUP='maybe'"):
        dedup.enabled_from_env()
    monkeypatch.setenv("VRADIX_PREFILL_DEDUP", "OFF")
    assert dedup.enabled_from_env() is False
