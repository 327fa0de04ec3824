"""E2E: a P/D decode role with HiCache L2 and L3 (`file`), vradix on both roles (`vradix.testing.pd`, real KV
transfer behind the real router). SGLang's decode restores a promised prefix from its own tiers: it matches device,
host and storage, promises prefill `decode_prefix_len` (only the L3 span its prefetch took), reserves device room for
the restore, and fails the request when the restore comes up short. vradix keys all of it by the request's
role-local namespace (`vradix.pd.layout`).

- restore under the right identity: the prompt's pages decode stored under weights A are restored from L3 after its
  device and host tiers were flushed, and the output equals a fresh non-P/D server on A;
- after both roles publish B, decode never restores A's pages: the request is computed under B, as a fresh server on
  B computes it;
- pages lost from the store before the promise (deleted after decode indexed them) are not promised: decode's hit
  query checks the store itself, prefill computes the rest, and the idle pool is exact. A page lost *between* the
  promise and the restore is SGLang's restore-failure path (`HiCacheRestoreResult.FAILED`); it needs a deletion timed
  inside decode's prefetch and is not exercised here.

The oracle is a fresh non-P/D stock server on each weight (the session's `pd_oracle`).
"""
import os

import pytest

from vradix.testing import pd
from vradix.testing.hicache_store import STORE_ENV, current_namespace, page_files, wait_stored
from vradix.testing.reliability import strict_idle_check, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

MISSING = pd.missing_requirements()
needs_pd = pytest.mark.skipif(bool(MISSING), reason="P/D kit needs: " + ", ".join(MISSING))

PROMPT = pd.PROMPT
SERVED = ["--served-model-name", "tiny"]
DECODE_L3 = ["--enable-hierarchical-cache", "--hicache-ratio", "2", "--hicache-storage-backend", "file",
             "--hicache-storage-prefetch-policy", "wait_complete",
             "--hicache-storage-backend-extra-config", '{"enable_metadata_cache": true, "metadata_ttl": 3600}']


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


@needs_pd
def test_pages_lost_from_the_store_are_never_promised_and_nothing_leaks(pair, store, oracle):
    """Half of the prompt's pages are deleted from the store (another engine's garbage collection, say) after decode
    indexed them in its metadata cache: decode promises only the pages still there, prefill computes the rest, the
    answer is a fresh server's and the idle pool is exact (the strict leak check)."""
    wait_stored(pair.decode, store, PROMPT)  # B's pages, from the previous test's request
    flush_decode_tiers(pair)
    pages = page_files(store, PROMPT, current_namespace(pair.decode))
    for f in pages[300:]:
        os.remove(f)
    served = pair.generate(PROMPT, 6)
    assert promised_by_decode(served) == 300, served["meta_info"]["pd_spans"]
    assert [s["role"] for s in served["meta_info"]["pd_spans"]] == ["decode_cache", "prefill", "decode"]
    assert served["output_ids"] == oracle["B"]
    strict_idle_check(pair.decode)
