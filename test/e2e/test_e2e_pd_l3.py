"""E2E: a P/D decode role with HiCache L2 and L3 (`file`), vradix on both roles (`vradix.testing.harness.pd`, real KV
transfer behind the real router). SGLang's decode restores a promised prefix from its own tiers: it matches device,
host and storage, promises prefill `decode_prefix_len` (only the L3 span its prefetch took), reserves device room for
the restore, and fails the request when the restore comes up short. vradix keys all of it by the request's
role-local namespace (`vradix.pd.layout`).

Decode's L3 is SGLang's `file` store behind the test aid `vradix.testing.cpu_aids.lossy_store` (loaded with
`--hicache-storage-backend dynamic`; same files, same keys, same metadata cache), which loses pages at read time only
while a test asks it to.

- restore under the right identity: the prompt's pages decode stored under weights A are restored from L3 after its
  device and host tiers were flushed, and the output equals a fresh non-P/D server on A;
- after both roles publish B, decode never restores A's pages: the request is computed under B, as a fresh server on
  B computes it;
- a page lost between the promise and the restore (the store still reports it, the read finds it gone): decode's
  restore comes up short, SGLang fails that attempt on decode (`HiCacheRestoreResult.FAILED`), which vradix answers
  with HTTP 503 naming the lost pages (`vradix.pd.lost_restore`; stock answers a generic 500); the router retries it,
  and the retry is computed correctly: decode promises only the pages that really loaded, the lost span is never a hit, nothing
  leaks, and the pair keeps serving;
- pages deleted from the store behind decode's back (after its metadata cache indexed them) are the same path: the
  metadata cache still reports them, decode promises them, the restore comes up short and fails with the 503, and the
  router's retry gets only the pages that loaded from decode and the rest from prefill; the idle pool is exact.

The oracle is a fresh non-P/D stock server on each weight (the session's `pd_oracle`). The router is smg, which
retries a request whose decode answered 500 or 503 (its default retry policy); the 503 itself is checked at cache
level (`test_publication_hooks.py::test_a_restore_that_came_up_short_is_answered_503_naming_the_lost_pages`).
"""
import os

import pytest

from vradix.testing.harness import pd
from vradix.testing.cpu_aids import lossy_store
from vradix.testing.harness.hicache_store import STORE_ENV, current_namespace, page_files, wait_stored
from vradix.testing.harness.reliability import strict_idle_check, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

MISSING = pd.missing_requirements()
needs_pd = pytest.mark.skipif(bool(MISSING), reason="P/D kit needs: " + ", ".join(MISSING))

PROMPT = pd.PROMPT
SERVED = ["--served-model-name", "tiny"]
# decode's L3: SGLang's `file` store behind the aid that can lose pages at read time (off until a test turns it on)
DECODE_L3 = ["--enable-hierarchical-cache", "--hicache-ratio", "2", "--hicache-storage-prefetch-policy", "wait_complete",
             *lossy_store.backend_args(enable_metadata_cache=True, metadata_ttl=3600)]
#: what SGLang's decode logs when a restore comes up short, just before it fails the request
RESTORE_FAILED = "HiCache load_back failed for rid="


@pytest.fixture(scope="module")
def oracle(pd_oracle):
    return pd_oracle


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return str(tmp_path_factory.mktemp("decode-l3"))


@pytest.fixture(scope="module")
def pair(models, store, oracle):
    with pd.PdPair(models[0], vradix=True, prefill_args=SERVED, decode_args=[*SERVED, *DECODE_L3],
                   env={STORE_ENV: store}, startup_timeout=600) as p:
        yield p


def flush_decode_tiers(pair) -> None:
    """Empty decode's device and host tiers (an idle flush: the namespace stays), so only L3 holds the prompt."""
    wait_until(lambda: pair.decode.post("/flush_cache").status_code == 200, 60, "decode idle for a flush")
    pool = pair.decode.vradix_info()["pool"]
    assert pool["evictable"] == pool["protected"] == 0 and pool["host"]["used"] == 0, pool


def promised_by_decode(response) -> int:
    """The prefix decode matched in its own tiers and promised prefill (`pd_spans`' `decode_cache` span)."""
    spans = response["meta_info"]["pd_spans"]
    return spans[0]["end"] if spans[0]["role"] == "decode_cache" else 0


@needs_pd
def test_decode_restores_its_promised_prefix_from_l3_under_its_identity(pair, store, oracle):
    first = pair.generate(PROMPT, 6)
    assert first["output_ids"] == oracle["A"] and promised_by_decode(first) == 0
    wait_stored(pair.decode, store, PROMPT)
    flush_decode_tiers(pair)
    again = pair.generate(PROMPT, 6)
    # with device and host empty, the prefix decode promised can only come from its L3 pages, restored before use
    assert promised_by_decode(again) >= len(PROMPT) - 1, again["meta_info"]
    assert again["output_ids"] == oracle["A"]
    assert {s["weight_id"] for s in again["meta_info"]["pd_spans"]} == {pair.decode.vradix_info()["weight_id"]}


@needs_pd
def test_after_a_publication_decode_never_restores_the_old_identitys_pages(pair, models, store, oracle):
    a_pages = page_files(store, PROMPT, current_namespace(pair.decode))
    assert all(os.path.exists(f) for f in a_pages)  # A's pages are still in the store
    for server in (pair.prefill, pair.decode):
        server.update_weights(models[1], "B")
    flush_decode_tiers(pair)  # nothing but L3 to match in, and L3 holds A's pages only
    served = pair.generate(PROMPT, 6)
    assert promised_by_decode(served) == 0 and served["output_ids"] == oracle["B"], served


def restore_failures(server) -> int:
    """How many restores came up short on `server` so far (SGLang's decode log)."""
    return server.logs().count(RESTORE_FAILED)


@needs_pd
def test_a_page_lost_between_promise_and_restore_fails_safely_is_recomputed_and_nothing_leaks(pair, store, oracle):
    """Decode's storage query finds all 600 pages of the prompt and it promises them; then its prefetch's reads find
    pages 300 on gone (`lossy_store`: the read deletes the page first). The restore loads 300 of the 600 promised
    tokens, so SGLang fails that attempt on decode ("HiCache local restore failed on this rank") instead of serving
    it; vradix answers it with a 503 naming the lost pages, and the router retries. The retry must not see the lost span as a hit: decode promises only the 300
    tokens the failed restore did load (now in its host tier), prefill computes the rest, and the answer is a fresh
    server's. Nothing leaks on either role, and the pair keeps serving."""
    wait_stored(pair.decode, store, PROMPT)  # B's pages, from the previous test's request
    flush_decode_tiers(pair)
    pages = page_files(store, PROMPT, current_namespace(pair.decode))
    failures = restore_failures(pair.decode)
    lossy_store.lose_on_read(store, pages[300:])
    try:
        served = pair.generate(PROMPT, 6)
    finally:
        lossy_store.stop_losing(store)
    # the first attempt failed on decode, and only it (the store's files prove nothing here: the retry stores the
    # lost pages again, asynchronously)
    assert restore_failures(pair.decode) == failures + 1
    assert promised_by_decode(served) == 300, served["meta_info"]["pd_spans"]
    assert [s["role"] for s in served["meta_info"]["pd_spans"]] == ["decode_cache", "prefill", "decode"]
    assert served["output_ids"] == oracle["B"]
    strict_idle_check(pair.decode)
    strict_idle_check(pair.prefill)
    again = pair.generate(PROMPT, 6)  # lose off: the retry's whole prompt is decode's now, and it is B's
    assert again["output_ids"] == oracle["B"] and restore_failures(pair.decode) == failures + 1
    strict_idle_check(pair.decode)


@needs_pd
def test_pages_deleted_behind_decodes_back_fail_the_restore_and_the_retry_is_correct(pair, store, oracle):
    """Half of the prompt's pages are deleted from the store (another engine's garbage collection, say) after decode
    indexed them in its metadata cache. The metadata cache still answers that they exist, so decode promises them
    and its restore comes up short: that attempt fails on decode and the router retries it. The retry promises only
    the pages that loaded (pages 0-299, now in decode's host tier), prefill computes the rest, the answer is a fresh
    server's and the idle pool is exact (the strict leak check)."""
    wait_stored(pair.decode, store, PROMPT)  # B's pages: the previous test's retry stored again what was lost
    flush_decode_tiers(pair)
    pages = page_files(store, PROMPT, current_namespace(pair.decode))
    for f in pages[300:]:
        os.remove(f)
    failures = restore_failures(pair.decode)
    served = pair.generate(PROMPT, 6)
    assert restore_failures(pair.decode) == failures + 1
    assert promised_by_decode(served) == 300, served["meta_info"]["pd_spans"]
    assert [s["role"] for s in served["meta_info"]["pd_spans"]] == ["decode_cache", "prefill", "decode"]
    assert served["output_ids"] == oracle["B"]
    strict_idle_check(pair.decode)
