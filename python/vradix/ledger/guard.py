"""Run-time checks on the KV page ledger: the prefix verify guard, its verdicts and the post-publication audit.

Verify guard (`VRADIX_VERIFY=off|sample|strict`, default `strict`):
* strict — the backstop at the last point before the forward (`Scheduler.run_batch`, BEFORE): for an extend batch,
  every KV position a request reads without this forward writing it — positions [0, prefix_len) of its row,
  whatever put them there: a tree match, a streaming session's lent record, a restored retraction backup, a
  HiCache load-back, a P/D transfer — must lie on a page whose ledger epoch is the request's bound epoch, or, for a
  crossing request, an epoch from its bound one to the current one (its own KV, computed across the bumps it
  crossed; `allowed_epochs`). One gather/compare over the whole batch, launched on the device before the forward
  (`kernels.rows_outside_epochs`) and read on the host at the batch's result, where SGLang waits for that forward
  anyway (the verdicts, below): no device synchronisation is added to a scheduler iteration. A violating
  request fails with a clear error (vradix, the epochs, the count of bad positions) through SGLang's own "forward
  ran on KV that must not be used" path: its output is discarded, it finishes aborted, and it inserts nothing
  (`hooks.ledger.fail_stale_reads`). `violations_caught` counts it.
  The backstop sees only what the ledger records (see `vradix.ledger.device`): state outside the KV pool (a recurrent
  state slot, an embedding cache, weight-derived buffers) and KV written by paths that bypass the ledger (the
  engines where the ledger is off) are not checked.
* sample — every Nth extend batch (`VRADIX_VERIFY_SAMPLE_EVERY`, default 16) gets the strict check, launched and
  read the same way. Detection only: a violation is counted and logged.
* off — no check.

Audit (`VRADIX_AUDIT=off|report|repair`, default `report`), after every publication: pages stamped with an older
epoch that no live request's row references are stale pages nobody owns any more (the bump already freed every
unlocked stale node, and a locked one is in its holder's row) — leaks. They are counted in `leaked_pages_*`; in
`repair` mode they are also returned to the allocator.

Verdicts (`DeviceValues`, `Verdict`, `PendingVerdicts`, below): the guard's check results, ledger checks launched
on the device before a forward and read where SGLang already waits for that forward.

A strict backstop check (and a sampled one) is a gather/compare the device runs in stream order before the batch's
forward. Reading its result at once would make the host wait for everything queued before it: a device
synchronisation per extend batch, which serialises SGLang's overlap scheduler. Nothing needs the verdict before the
forward runs: a violating request's output is discarded after its forward, and nothing it computed reaches the tree
before its result is processed (`process_batch_result`), where SGLang waits for that batch anyway. So each check is
a `Verdict`, launched with its batch and read:

* at the batch's result (`PendingVerdicts.read_through`, BEFORE `Scheduler.process_batch_result`): the verdicts
  of that batch and of every batch launched before it. The verdict was queued before the batch's forward, so by the
  time SGLang waits for that forward's output nothing of the verdict is left to wait for;
* at a chunked request's checkpoint (`read_if_ready`): the one insert SGLang makes before the result is processed
  (the overlap loop stashes a chunk while scheduling the next batch). A verdict the device already reports complete
  is read there (no wait); otherwise the checkpoint is held, nothing inserted, and the next checkpoint or the final
  insert covers it (`hooks.ledger.hold_stash_until_verdict`);
* at a publication (`read_all`), which drains in-flight batches and may synchronise.

Invariant: between a check's launch and its batch's result, the host reads nothing the check computed unless the
device reported it complete (`DeviceValues.ready`). On a ledger in host memory (a CPU engine, `kernels.on_host`) the
check's result is a host list from the start: complete, read without a device.
"""
from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable, Optional, Union

import torch

from vradix import kernels, request, settings
from vradix.ledger.device import PageLedger
from vradix.request import ReqState

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req

logger = logging.getLogger("vradix")

@dataclass
class GuardConfig:
    """The guard's and the audit's modes: VRADIX_VERIFY, VRADIX_VERIFY_SAMPLE_EVERY, VRADIX_AUDIT (`vradix.settings`),
    narrowed to detection only on a multi-rank engine (`for_ranks`)."""

    verify: str = "strict"
    sample_every: int = 16
    audit: str = "report"
    #: detection only: a strict violation is counted and logged but the request runs, and `repair` only reports.
    #: Set when the engine has more than one TP/PP rank (`for_ranks`): each rank decides from its own ledger, and
    #: ranks that disagreed on a prefix length or on freed pages would schedule differently and hang a collective.
    detect_only: bool = False

    @classmethod
    def from_env(cls) -> "GuardConfig":
        """The modes the environment sets. Raises `settings.SettingsError` for an unusable one."""
        return cls(verify=settings.value("VRADIX_VERIFY"), sample_every=settings.value("VRADIX_VERIFY_SAMPLE_EVERY"),
                   audit=settings.value("VRADIX_AUDIT"))

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
    #: request prefixes checked against the ledger (strict: each extend read; plus each HiCache load-back)
    prefixes_verified: int = 0
    #: verdicts read on the host (each one a gather/compare for a whole batch, read at the batch's result)
    verify_host_reads: int = 0
    batches_verified: int = 0
    #: chunk checkpoints held because their chunk's verdict was not complete yet (overlap loop; inserted later)
    checkpoints_held: int = 0
    violations_caught: int = 0
    last_violation: str = ""
    leaked_pages_total: int = 0
    leaked_pages_last: int = 0
    leaked_pages_repaired: int = 0
    audits: int = 0
    _prefill_batches_seen: int = 0


# ---- verdicts: checks launched on the device, read where SGLang already waits -----------------------------------
@dataclass
class DeviceValues:
    """A small integer result of a check: a host list (already complete), or a device tensor with, on CUDA, its
    non-blocking copy into pinned host memory and the event recorded after that copy."""

    values: Union[list, torch.Tensor]
    host: Optional[torch.Tensor] = None
    done: Optional["torch.cuda.Event"] = None

    @classmethod
    def launch(cls, values: Union[list, torch.Tensor]) -> "DeviceValues":
        """Start bringing `values` to the host without waiting for them."""
        if isinstance(values, list) or values.device.type != "cuda":
            return cls(values)
        host = torch.empty(values.shape, dtype=values.dtype, device="cpu", pin_memory=True)
        host.copy_(values, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        return cls(values, host, done)

    def ready(self) -> bool:
        """Complete without waiting: a host list, or a copy whose event the device reports done. A device tensor
        without an event (the device forms run on CPU, `VRADIX_KERNELS=torch`) is never assumed complete."""
        return isinstance(self.values, list) or (self.done is not None and self.done.query())

    def read(self) -> list:
        """The values on the host. Waits only for what was queued before the check's copy."""
        if isinstance(self.values, list):
            return self.values
        if self.done is not None:
            assert self.host is not None, "a check with a copy event has a host buffer"
            self.done.synchronize()
            return self.host.tolist()
        return self.values.tolist()


@dataclass
class Verdict:
    """One launched check: its batch (`batch_key`: the batch's `out_cache_loc`, the one field the copy SGLang
    queues for result processing shares with the batch that ran), the requests it is about, its values, and what
    reading them does (`settle`: fail or record the violations, with the values read on the host)."""

    batch_key: object
    reqs: tuple
    values: DeviceValues
    settle: Callable[[list], None]

    def names(self, req) -> bool:
        return any(r is req for r in self.reqs)


class PendingVerdicts:
    """The verdicts launched and not yet read, oldest first (the guard's own record; written only through these
    methods, by `hooks.ledger` and the publication). Each verdict is read exactly once."""

    def __init__(self):
        self._queue: deque[Verdict] = deque()

    def __len__(self) -> int:
        return len(self._queue)

    def launch(self, batch_key, reqs, values: Union[list, torch.Tensor], settle: Callable[[list], None]) -> None:
        self._queue.append(Verdict(batch_key, tuple(reqs), DeviceValues.launch(values), settle))

    def awaits(self, req) -> bool:
        """Whether a verdict about `req` has not been read yet."""
        return any(v.names(req) for v in self._queue)

    def read_at_result(self, batch_key, stats: GuardStats) -> bool:
        """At a batch's result (`read_through`): whether a violation was caught by what was read. Nothing to read:
        one length test."""
        if not self._queue:
            return False
        caught = stats.violations_caught
        self.read_through(batch_key)
        return stats.violations_caught != caught

    def read_through(self, batch_key) -> int:
        """At a batch's result: read that batch's verdict and every one launched before it (results are processed
        in launch order). Nothing when no verdict is that batch's. Returns how many were read."""
        through = -1
        for i, v in enumerate(self._queue):
            if v.batch_key is batch_key:
                through = i
                break
        for _ in range(through + 1):
            self._read_oldest()
        return through + 1

    def read_if_ready(self, req) -> bool:
        """Read, oldest first, every verdict the device already reports complete, up to the last one about `req`.
        True when none about `req` is left unread."""
        while self._queue and self._queue[0].values.ready() and self.awaits(req):
            self._read_oldest()
        return not self.awaits(req)

    def read_all(self) -> int:
        """At a publication (which drains the device): read every verdict. Returns how many were read."""
        n = len(self._queue)
        while self._queue:
            self._read_oldest()
        return n

    def _read_oldest(self) -> None:
        verdict = self._queue.popleft()
        verdict.settle(verdict.values.read())


# ---- strict: the forward backstop -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class PrefixRead:
    """The KV an extend batch's forward reads for one request without writing it: positions [0, length) of its row,
    each of which must lie on a page whose epoch is in [lo, hi]."""
    req: Req
    row: int
    length: int
    lo: int
    hi: int


def allowed_epochs(st: Optional[ReqState], current: int) -> tuple[int, int]:
    """The epochs a request's prefix pages may carry: its bound epoch; for a crossing request, also every epoch from
    there to the current one (its own KV, computed across the bumps it crossed). A request vradix never bound may
    read only current-epoch KV (fail closed)."""
    if st is None:
        return current, current
    # a bounded request's namespace holds KV computed from its epoch up to now (`vradix.core.staleness`)
    return (st.epoch, current) if st.crossed or st.max_staleness else (st.epoch, st.epoch)


def prefix_reads(batch, current: int) -> list[PrefixRead]:
    """The prefix reads of an extend batch: every request it extends (not the decoding requests a mixed batch
    carries, whose KV passed this check at their own prefill) that reads at least one cached position."""
    decoding = batch.decoding_reqs
    reads = []
    for req, n in zip(batch.reqs, batch.prefix_lens):
        if n > 0 and not (decoding and req in decoding):
            lo, hi = allowed_epochs(request.of(req), current)
            reads.append(PrefixRead(req, req.kv.req_pool_idx, n, lo, hi))
    return reads


def first_decode_reads(batch, current: int) -> list[PrefixRead]:
    """The reads of a P/D decode prebuilt batch: each request whose received KV was committed and not yet checked
    (`ReqState.pd_first_read_pending`, cleared here) reads its committed KV [0, kv_committed_len)."""
    reads = []
    for req in batch.reqs:
        st = request.of(req)
        if st is None or not st.take_first_read():
            continue
        n = int(req.kv.kv_committed_len or 0)
        if n > 0:
            lo, hi = allowed_epochs(st, current)
            reads.append(PrefixRead(req, req.kv.req_pool_idx, n, lo, hi))
    return reads


def launch_backstop(ledger: PageLedger, config: GuardConfig, stats: GuardStats, verdicts: PendingVerdicts, batch,
                    current: int, req_to_token: torch.Tensor, fail: Callable[[object, str], None]) -> None:
    """The strict guard's backstop for one extend batch (every Nth batch, detection only, in sample mode): every
    cached KV position its requests read must carry the epoch each request is bound to (or, crossing or bounded, an
    epoch from there to `current`: `allowed_epochs`). One pass over the batch's requests with no call per request,
    one gather/compare launched on the device for the whole batch, its verdict read at the batch's result
    (`PendingVerdicts.read_at_result`), where `fail(req, message)` fails each violating request (none when the engine
    only detects)."""
    if config.verify != "strict" and not checks_batch(config, stats):
        return
    decoding = batch.decoding_reqs
    reqs, rows, lens, los, his = [], [], [], [], []
    for req, n in zip(batch.reqs, batch.prefix_lens):
        if n > 0 and not (decoding and req in decoding):
            st = getattr(req, request.ATTR, None)
            lo = current if st is None else st.bound.epoch
            reqs.append(req)
            rows.append(req.kv.req_pool_idx)
            lens.append(n)
            los.append(lo)
            his.append(current if st is None or st.crossed or st.max_staleness else lo)
    if not reqs:
        return
    stats.batches_verified += 1
    stats.prefixes_verified += len(reqs)
    counts = ledger.kernels.rows_outside_epochs(ledger.page_epoch, req_to_token, rows, lens, los, his,
                                                ledger.page_size)

    def settle(values: list) -> None:
        if not any(values):
            stats.verify_host_reads += 1
            return
        bad = [(PrefixRead(reqs[i], rows[i], lens[i], los[i], his[i]), n) for i, n in enumerate(values) if n]
        for req, what in reads_to_fail(ledger, config, stats, req_to_token, [r for r, _ in bad], [n for _, n in bad],
                                       current):
            fail(req, what)

    verdicts.launch(batch.out_cache_loc, reqs, counts, settle)


def launch_prefix_check(ledger: PageLedger, stats: GuardStats, req_to_token: torch.Tensor,
                        reads: list[PrefixRead]):
    """One gather/compare over every read of the batch, nothing read back: per read, its count of bad positions (a
    device tensor, or a host list for a ledger in host memory; the ledger's `rows_outside_epochs`, `kernels.bind`)."""
    stats.batches_verified += 1
    stats.prefixes_verified += len(reads)
    return ledger.kernels.rows_outside_epochs(ledger.page_epoch, req_to_token, [r.row for r in reads],
                                              [r.length for r in reads], [r.lo for r in reads],
                                              [r.hi for r in reads], ledger.page_size)


def violation_message(ledger: PageLedger, req_to_token: torch.Tensor, read: PrefixRead, bad: int,
                      current: int) -> str:
    """What the request fails with: vradix, the epochs expected and found, and how many positions are bad."""
    epochs = kernels.reference.row_epochs(ledger.page_epoch, req_to_token, read.row, read.length, ledger.page_size)
    found = sorted({int(e) for e in epochs.tolist()} - set(range(read.lo, read.hi + 1)))
    want = f"epoch {read.lo}" if read.lo == read.hi else f"epochs {read.lo}..{read.hi}"
    return (f"vradix KV backstop: request {read.req.rid} would read {bad} of {read.length} prefix KV positions not "
            f"written under {want} (found epoch(s) {found}, -1 = freed page; engine epoch {current})")


def matched_prefix_violations(ledger: PageLedger, slots: torch.Tensor, expected_epoch: int) -> kernels.Violations:
    """Verify one adopted match: its slots as a one-row table."""
    n = slots.numel()
    table = slots.reshape(1, n)
    dev = ledger.page_epoch.device
    out = ledger.kernels.verify(ledger.page_epoch, table, torch.zeros(1, dtype=torch.int64, device=dev),
                                torch.full((1,), n, dtype=torch.int64, device=dev),
                                torch.full((1,), expected_epoch, dtype=torch.int32, device=dev), ledger.page_size, n)
    return kernels.Violations(*out.tolist())


def record_violation(stats: GuardStats, what: str) -> None:
    stats.violations_caught += 1
    stats.last_violation = what
    logger.error("vradix verify guard: %s", what)


#: what a violation's record says when the engine only detects (`GuardConfig.detect_only`)
DETECTED_ONLY = "detected only (more than one TP/PP rank)"
#: what a violation's record says under VRADIX_VERIFY=sample
SAMPLED_ONLY = "detected only (sample mode)"


def reads_to_fail(ledger: PageLedger, config: GuardConfig, stats: GuardStats, req_to_token: torch.Tensor,
                  reads: list[PrefixRead], counts: list[int], current: int) -> list[tuple[object, str]]:
    """The verdict of a batch's prefix reads, `counts` read on the host (`launch_prefix_check`): every violation is
    recorded, and the (request, message) of each one that must fail is returned; none when the engine only
    detects (more than one rank, or the sample mode)."""
    stats.verify_host_reads += 1
    detect_only = config.detect_only or config.verify != "strict"
    failing = []
    for read, n in zip(reads, counts):
        if not n:
            continue
        what = violation_message(ledger, req_to_token, read, n, current)
        outcome = ((DETECTED_ONLY if config.detect_only else SAMPLED_ONLY) if detect_only
                   else "failing the request")
        record_violation(stats, f"{what}; {outcome}")
        if not detect_only:
            failing.append((read.req, what))
    return failing


# ---- which batches are checked ----------------------------------------------------------------------------------------
def checks_batch(config: GuardConfig, stats: GuardStats) -> bool:
    """strict: every extend batch; sample: every `sample_every`-th one (counted here); off: none."""
    if config.verify == "strict":
        return True
    if config.verify != "sample":
        return False
    stats._prefill_batches_seen += 1
    return (stats._prefill_batches_seen - 1) % config.sample_every == 0


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
    leaked = ledger.kernels.invalidate(ledger.page_epoch, int(epoch), pinned_pages(ledger, tree_cache, live))
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
