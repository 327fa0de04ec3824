"""Run-time checks on the KV page ledger: the prefix verify guard and the post-publication audit.

Verify guard (`VRADIX_VERIFY=off|sample|strict`, default `strict`):
* strict — every tree match a request adopts is checked before anything is allocated for it: each matched position's
  page must carry the request's epoch. On a violation the match is redone as a miss (SGLang itself records an empty
  match), so the corrupt KV never reaches the model and the request recomputes its prompt; `violations_caught`
  counts it. Nothing is locked at match time, so nothing has to be undone.
  Cost: SGLang re-matches every waiting request (up to 128) on every prefill pass (`SchedulePolicy.calc_priority`:
  `lpm`, and `fcfs` on a tree core that reports a fast match) and once more when it admits one, so the check would
  be paid per pass per waiting request. Two things keep it at about one check per admission and one host read per pass:
  - the verdict cache: a request's verdict is kept in its `ReqState` with the key `(epoch, matched length, last
    node, ledger generation)` (`verdict_key`) and reused while the key is unchanged;
  - batching: the matches of one `calc_priority` pass are verified together at its end, one gather/compare over all
    their slots and one host read (`kernels.prefix_violation_counts`).
  Why a reused verdict is sound. A verdict says: the slots the tree returned for this request's match all lie on
  pages that read the request's epoch E. A later match with the same key returns the same slots: the slots are the
  path from the namespace root of E to `last node`, cut at the same length, and SGLang's tree never rewrites the
  value of a live node (a split keeps the path's slots; a node that goes away frees its pages, which moves the
  generation, and so does a HiCache load-back of new device slots, `PageLedger.note_overwritten`). Those pages still
  read E: the ledger generation moves on every event that can make a page stop reading an epoch it read — a free,
  a clear, an overwrite, a write under another epoch than the previous write's — and the verdict is only cached
  when the last write's epoch was E (or there was none), so the writes the generation lets through only write E.
  What forces a fresh check is exactly what can make the old verdict wrong: a larger matched length (positions
  never checked), a publication (the request is re-bound to a new epoch: a different E and namespace root), a
  different last node, or any free/reuse of pages in between (the pages of a verified prefix can be freed and
  reused between two matches of the same request). A new request never inherits a verdict.
* sample — every Nth prefill batch (`VRADIX_VERIFY_SAMPLE_EVERY`, default 16) that reuses cached prefix KV is checked
  after its rows are written, with one fused kernel over the batch. Detection only: a violation is counted and logged.
* off — no check.

Audit (`VRADIX_AUDIT=off|report|repair`, default `report`), after every publication: pages stamped with an older
epoch that no live request's row references are stale pages nobody owns any more (the bump already freed every
unlocked stale node, and a locked one is in its holder's row) — leaks. They are counted in `leaked_pages_*`; in
`repair` mode they are also returned to the allocator.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, replace
from typing import Optional

import torch

from vradix import kernels, request
from vradix.ledger import PageLedger
from vradix.request import ReqState

logger = logging.getLogger("vradix")

VERIFY_MODES = ("off", "sample", "strict")
AUDIT_MODES = ("off", "report", "repair")


class GuardConfigError(ValueError):
    """A VRADIX_VERIFY / VRADIX_AUDIT setting that vradix does not understand."""


@dataclass
class GuardConfig:
    verify: str = "strict"
    sample_every: int = 16
    audit: str = "report"
    #: detection only: a strict violation is counted and logged but the match stands, and `repair` only reports.
    #: Set when the engine has more than one TP/PP rank (`for_ranks`): each rank decides from its own ledger, and
    #: ranks that disagreed on a prefix length or on freed pages would schedule differently and hang a collective.
    detect_only: bool = False

    @classmethod
    def from_env(cls) -> "GuardConfig":
        verify = os.environ.get("VRADIX_VERIFY", "strict").strip().lower()
        audit = os.environ.get("VRADIX_AUDIT", "report").strip().lower()
        every = os.environ.get("VRADIX_VERIFY_SAMPLE_EVERY", "16").strip()
        if verify not in VERIFY_MODES:
            raise GuardConfigError(f"VRADIX_VERIFY={verify!r}: expected one of {', '.join(VERIFY_MODES)}")
        if audit not in AUDIT_MODES:
            raise GuardConfigError(f"VRADIX_AUDIT={audit!r}: expected one of {', '.join(AUDIT_MODES)}")
        if not every.isdigit() or int(every) < 1:
            raise GuardConfigError(f"VRADIX_VERIFY_SAMPLE_EVERY={every!r}: expected a positive integer")
        return cls(verify=verify, sample_every=int(every), audit=audit)

    def for_ranks(self, tp_size: int, pp_size: int = 1) -> "GuardConfig":
        """This config for an engine of `tp_size` x `pp_size` ranks: detection only when there is more than one."""
        multi = tp_size * pp_size > 1
        if multi and (self.verify == "strict" or self.audit == "repair"):
            logger.warning("vradix verify guard: %d TP x %d PP ranks; verify=%s and audit=%s act per rank, so they "
                           "only detect and report here (a per-rank decision would desynchronise the ranks)",
                           tp_size, pp_size, self.verify, self.audit)
        return replace(self, detect_only=multi)


@dataclass
class GuardStats:
    #: matched prefixes checked against the ledger (each one a fresh verdict)
    prefixes_verified: int = 0
    #: matches whose cached verdict was reused (no check)
    verdicts_reused: int = 0
    #: strict checks run (each one a gather/compare and one host read, for one prefix or for a whole pass)
    verify_host_reads: int = 0
    batches_verified: int = 0
    violations_caught: int = 0
    last_violation: str = ""
    leaked_pages_total: int = 0
    leaked_pages_last: int = 0
    leaked_pages_repaired: int = 0
    audits: int = 0
    _prefill_batches_seen: int = 0


# ---- strict: at match time -------------------------------------------------------------------------------------------
@dataclass
class PendingMatch:
    """A match taken inside a scheduling pass, verified with the pass's others at its end."""
    req: object
    slots: torch.Tensor
    epoch: int
    key: Optional[tuple]


def verdict_key(ledger: PageLedger, req, epoch: int) -> Optional[tuple]:
    """The key a verdict on `req`'s current match is valid for, or None when it may not be cached (the ledger's last
    write was under another epoch, so a later write that the generation lets through could overwrite epoch pages)."""
    written = ledger.written_epoch
    if written is not None and written != epoch:
        return None
    return (epoch, req.prefix_len, req.last_node, ledger.generation)


def verify_match(ledger: PageLedger, stats: GuardStats, st: ReqState, slots: torch.Tensor, epoch: int,
                 key: Optional[tuple]) -> int:
    """Check one match now (one gather/compare, one host read) and cache the verdict in `st`. Returns its
    violation count."""
    n = kernels.prefix_violation_counts(ledger.page_epoch, [slots], [epoch], ledger.page_size)[0]
    stats.verify_host_reads += 1
    stats.prefixes_verified += 1
    st.verdict_key, st.verdict_ok = key, n == 0
    return n


def verify_matches(ledger: PageLedger, stats: GuardStats, pending: list[PendingMatch]) -> list[int]:
    """Check a scheduling pass's matches together (one gather/compare, one host read) and cache each verdict in its
    `ReqState`. Returns the violation count of each."""
    if not pending:
        return []
    counts = kernels.prefix_violation_counts(ledger.page_epoch, [p.slots for p in pending],
                                             [p.epoch for p in pending], ledger.page_size)
    stats.verify_host_reads += 1
    stats.prefixes_verified += len(pending)
    for p, n in zip(pending, counts):
        st = request.require(p.req)
        st.verdict_key, st.verdict_ok = p.key, n == 0
    return counts


def matched_prefix_violations(ledger: PageLedger, slots: torch.Tensor, expected_epoch: int) -> kernels.Violations:
    """Verify one adopted match: its slots as a one-row table."""
    n = slots.numel()
    table = slots.reshape(1, n)
    dev = ledger.page_epoch.device
    return kernels.verify(ledger.page_epoch, table, torch.zeros(1, dtype=torch.int64, device=dev),
                          torch.full((1,), n, dtype=torch.int64, device=dev),
                          torch.full((1,), expected_epoch, dtype=torch.int32, device=dev), ledger.page_size,
                          max_prefix_len=n)


def record_violation(stats: GuardStats, what: str) -> None:
    stats.violations_caught += 1
    stats.last_violation = what
    logger.error("vradix verify guard: %s", what)


# ---- sample: one fused check per prefill batch -----------------------------------------------------------------------
def should_sample_batch(config: GuardConfig, stats: GuardStats) -> bool:
    if config.verify != "sample":
        return False
    stats._prefill_batches_seen += 1
    return (stats._prefill_batches_seen - 1) % config.sample_every == 0


def batch_violations(ledger: PageLedger, req_to_token: torch.Tensor, rows: list[int], prefix_lens: list[int],
                     epochs: list[int]) -> kernels.Violations:
    dev = ledger.page_epoch.device
    return kernels.verify(ledger.page_epoch, req_to_token, torch.tensor(rows, dtype=torch.int64, device=dev),
                          torch.tensor(prefix_lens, dtype=torch.int64, device=dev),
                          torch.tensor(epochs, dtype=torch.int32, device=dev), ledger.page_size,
                          max_prefix_len=max(prefix_lens))


# ---- audit: after every publication ----------------------------------------------------------------------------------
def pinned_pages(ledger: PageLedger, tree_cache, live) -> torch.Tensor:
    """Bool mask of the pages something still references: the padding page 0, every page the tree holds (a stale
    node kept by a lock that is not a live request's, e.g. a session or a pin), and every page in a live request's
    row (up to its allocated length)."""
    mask = torch.zeros_like(ledger.page_epoch, dtype=torch.bool)
    mask[0] = True
    tree_slots = tree_cache.tree_core.all_values_flatten()
    mask[tree_slots.to(device=mask.device, dtype=torch.int64) // ledger.page_size] = True
    req_to_token = tree_cache.req_to_token_pool.req_to_token
    for req in live:
        kv = req.kv
        if kv.holds_kv and kv.kv_allocated_len > 0:
            slots = req_to_token[kv.req_pool_idx, : kv.kv_allocated_len].to(torch.int64)
            mask[slots // ledger.page_size] = True
    return mask


def audit(config: GuardConfig, stats: GuardStats, ledger: PageLedger, tree_cache, live, epoch: int) -> int:
    """Find stale pages that neither the tree nor a live request references; count them and, in repair mode (not
    detection-only), free them. Returns the count. Never frees a page anything in `pinned_pages` holds."""
    if config.audit == "off":
        return 0
    leaked = kernels.invalidate(ledger.page_epoch, epoch, pinned_pages(ledger, tree_cache, live))
    n = int(leaked.numel())
    stats.audits += 1
    stats.leaked_pages_last = n
    stats.leaked_pages_total += n
    if n:
        repair = config.audit == "repair" and not config.detect_only
        logger.error("vradix audit: %d stale KV page(s) owned by neither the tree nor a live request (first %s)%s",
                     n, leaked[:8].tolist(), "; freeing them" if repair else "")
        if repair:
            free_pages(ledger, leaked)
            stats.leaked_pages_repaired += n
    return n


def free_pages(ledger: PageLedger, page_ids: torch.Tensor) -> None:
    allocator = ledger.allocator
    if ledger.page_size == 1:
        allocator.free(page_ids)
    else:
        allocator.free_page_ids(page_ids)
