"""Torch reference implementations of the four KV page-epoch kernels and of the weight-fingerprint digest.

These define the semantics; the Triton (`triton_impl`) and CUDA (`vradix._C`) implementations must return identical
results (the tests compare them on the same inputs). Conventions shared by all three:

* `page_epoch` is an int32 tensor with one entry per KV page of the token pool (page = slot // page_size); `FREE`
  (-1) marks a page the allocator owns, a value >= 0 is the weight epoch of the forward pass that last wrote it.
* `req_to_token` is SGLang's `ReqToTokenPool.req_to_token` (int32 or int64, [rows, max_context]) or any 2-D table of
  KV slots laid out the same way.
* The fingerprint digest (`fingerprint_words`, bottom of this file) works on a tensor's bytes as 32-bit words held in
  int64 and keeps every product below 2**63, so torch's int64 arithmetic, Triton's uint32 and CUDA's uint32 compute
  the same bits.
"""
from __future__ import annotations

import torch

FREE = -1
NO_VIOLATION = -1


def stamp(page_epoch: torch.Tensor, loc: torch.Tensor, epoch: int, page_size: int) -> None:
    """page_epoch[loc // page_size] = epoch, in place (duplicate pages in `loc` are fine). One scatter on the
    ledger's device, nothing read back (`host_stamp` is the same on numpy views, for a ledger in host memory)."""
    if loc.numel() == 0:
        return
    page_epoch.index_fill_(0, (loc.to(torch.int64) // page_size), epoch)


def host_stamp(page_epoch: torch.Tensor, loc: torch.Tensor, epoch: int, page_size: int) -> None:
    """`stamp` for CPU tensors: numpy views of the same memory skip torch's per-call dispatch (per batch and per
    free, on a CPU engine)."""
    if loc.numel() == 0:
        return
    pages = loc.numpy()
    page_epoch.numpy()[pages // page_size if page_size > 1 else pages] = epoch


def verify(page_epoch: torch.Tensor, req_to_token: torch.Tensor, rows: torch.Tensor, prefix_lens: torch.Tensor,
           expected_epochs: torch.Tensor, page_size: int, max_prefix_len: int | None = None) -> torch.Tensor:
    """Check every position p < prefix_lens[i] of row rows[i]: page_epoch[req_to_token[rows[i], p] // page_size] must
    equal expected_epochs[i].

    Returns an int64 tensor [count, first_i, first_pos] on page_epoch's device: the number of offending positions and
    the lexicographically first offender (batch index i, position), or -1, -1 when there is none. `max_prefix_len`
    (>= every prefix_lens[i]) lets a caller that knows it on the host avoid a device sync.
    """
    dev = page_epoch.device
    n = rows.numel()
    width = (int(prefix_lens.max().item()) if n else 0) if max_prefix_len is None else max_prefix_len
    if n == 0 or width == 0:
        return torch.tensor([0, NO_VIOLATION, NO_VIOLATION], dtype=torch.int64, device=dev)
    slots = req_to_token[rows.to(torch.int64), :width].to(torch.int64)
    in_prefix = torch.arange(width, device=dev)[None, :] < prefix_lens.to(torch.int64)[:, None]
    epochs = page_epoch[torch.where(in_prefix, slots, 0) // page_size]
    bad = (in_prefix & (epochs != expected_epochs.to(page_epoch.dtype)[:, None])).flatten()
    count = bad.sum()
    first = torch.argmax(bad.to(torch.uint8))  # index of the first True (0 when none; masked below)
    found = count > 0
    none = torch.tensor(NO_VIOLATION, device=dev)
    return torch.stack([count.to(torch.int64), torch.where(found, first // width, none),
                        torch.where(found, first % width, none)])


def rows_outside_epochs(page_epoch: torch.Tensor, req_to_token: torch.Tensor, meta: torch.Tensor, width: int,
                        page_size: int) -> torch.Tensor:
    """For each row i: how many of its first `lens[i]` positions lie on a page whose epoch is outside
    [lo[i], hi[i]] (a FREE page is outside every range), as an int64 tensor on the ledger's device.

    `meta` is an int64 [4, n] device tensor of rows, lengths, lows and highs (one host-to-device copy of the host
    lists); `width` >= every length, known on the host. One gather of the rows' slots and one compare for the whole
    batch, nothing read back: the caller reads the counts where the device is known to have finished
    (`vradix.ledger.guard.PendingVerdicts`)."""
    rows, lens, lo, hi = meta
    dev = page_epoch.device
    slots = req_to_token[rows.to(req_to_token.device), :width].to(device=dev, dtype=torch.int64)
    in_prefix = torch.arange(width, device=dev)[None, :] < lens[:, None]
    epochs = page_epoch[torch.where(in_prefix, slots, 0) // page_size]
    return (in_prefix & ((epochs < lo[:, None]) | (epochs > hi[:, None]))).sum(dim=1)


def device_rows_outside_epochs(page_epoch: torch.Tensor, req_to_token: torch.Tensor, rows: list[int],
                               lens: list[int], lo: list[int], hi: list[int], page_size: int,
                               kernel=rows_outside_epochs):
    """`rows_outside_epochs` from host lists, nothing read back: the lists travel to the ledger's device in one
    non-blocking copy, then `kernel` (this module's, or Triton's in one launch) runs the gather/compare. No rows:
    an empty host list."""
    if not rows:
        return []
    meta = torch.tensor([rows, lens, lo, hi], dtype=torch.int64).to(page_epoch.device, non_blocking=True)
    return kernel(page_epoch, req_to_token, meta, max(lens), page_size)


def host_rows_outside_epochs(page_epoch: torch.Tensor, req_to_token: torch.Tensor, rows: list[int],
                             lens: list[int], lo: list[int], hi: list[int], page_size: int) -> list[int]:
    """`rows_outside_epochs` for CPU tensors, as a host list: for a batch of a few prefixes of a few hundred slots,
    torch's per-call dispatch costs several times the gather, so the same arithmetic runs on numpy views."""
    return _rows_outside_epochs_host(page_epoch.numpy(), req_to_token.numpy(), rows, lens, lo, hi, page_size)


def _rows_outside_epochs_host(page_epoch, req_to_token, rows, lens, lo, hi, page_size: int) -> list[int]:
    import numpy as np

    if len(rows) > 1 and min(lo) == max(hi):
        # every read must carry one epoch (no crossing or bounded request in the batch, the common case): one gather
        # and one compare for the whole batch; only a batch that has a violation is counted row by row
        slots = np.concatenate([req_to_token[row, :n] for row, n in zip(rows, lens)])
        epochs = page_epoch.take(slots // page_size if page_size > 1 else slots)
        if not np.count_nonzero(epochs != lo[0]):
            return [0] * len(rows)
    out = []
    for row, n, a, b in zip(rows, lens, lo, hi):
        slots = req_to_token[row, :n]
        epochs = page_epoch.take(slots // page_size if page_size > 1 else slots)
        if a == b:
            out.append(int(np.count_nonzero(epochs != a)))
        else:
            out.append(int(np.count_nonzero((epochs < a) | (epochs > b))))
    return out


def row_epochs(page_epoch: torch.Tensor, req_to_token: torch.Tensor, row: int, length: int,
               page_size: int) -> torch.Tensor:
    """The epoch of each of the first `length` positions of `row` (int32, [length])."""
    slots = req_to_token[row, :length].to(torch.int64)
    return page_epoch[slots // page_size]


def spans(page_epoch: torch.Tensor, req_to_token: torch.Tensor, row: int, length: int,
          page_size: int, gather=row_epochs) -> list[tuple[int, int, int]]:
    """Run-length provenance of one row: [(epoch, start, end)] covering [0, length), end exclusive. `gather` reads
    the row's epochs (this module's `row_epochs`, or the CUDA extension's)."""
    if length <= 0:
        return []
    return runs_of(gather(page_epoch, req_to_token, row, length, page_size))


def runs_of(epochs: torch.Tensor) -> list[tuple[int, int, int]]:
    """[(value, start, end)] runs of a 1-D tensor (shared by every implementation's host-side tail)."""
    values, counts = torch.unique_consecutive(epochs.cpu(), return_counts=True)
    out, start = [], 0
    for v, c in zip(values.tolist(), counts.tolist()):
        out.append((int(v), start, start + int(c)))
        start += int(c)
    return out


def invalidate(page_epoch: torch.Tensor, epoch: int, pinned_mask: torch.Tensor | None) -> torch.Tensor:
    """Ascending int64 ids of pages stamped with an older epoch (0 <= e < epoch) and not pinned."""
    stale = (page_epoch >= 0) & (page_epoch < epoch)
    if pinned_mask is not None:
        stale &= ~pinned_mask.to(torch.bool)
    return torch.nonzero(stale).flatten().to(torch.int64)


# ---- weight fingerprint ---------------------------------------------------------------------------------------------
# Per word w (the tensor's bytes read as little-endian uint32) at position p (0-based within the tensor) and lane l:
#     g = lo32(p) * POS_LO[l] + hi32(p) * POS_HI[l] + SEEDS[l]      (mod 2**32: a per-lane Weyl sequence)
#     lane[l] += mix32(w ^ g)                                     (mod 2**64)
# mix32 is a bijection of 32 bits, so changing any single word changes every lane (the lane moves by a nonzero amount
# below 2**32); position enters through g, so swaps and shifts change the lanes too. These constants are part of the
# fingerprint: changing any of them changes every fingerprint (bump fingerprint.VERSION).
LANES = 4
MASK32 = 0xFFFFFFFF
MIX_MUL = (0x21F0AAAD, 0x735A2D97)  # "lowbias32" (hash-prospector); both below 2**31, so x * c < 2**63 for x < 2**32
POS_LO = (0x27D4EB2F, 0x165667B1, 0x61C88647, 0x7FEB352D)  # odd, below 2**31
POS_HI = (0x5BD1E995, 0x1B873593, 0x2545F491, 0x4CF5AD43)  # below 2**31
SEEDS = (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344)
#: words per step: on CPU cache-sized int64 temporaries below torch's intra-op grain size (larger steps ran up to 10x
#: slower on a 2-core machine); on an accelerator large steps, to amortise the launches
FINGERPRINT_CHUNK = {"cpu": 1 << 15}
FINGERPRINT_CHUNK_DEFAULT = 1 << 24


def mix32(x: torch.Tensor) -> torch.Tensor:
    """32-bit avalanche finalizer, in place, on an int64 tensor holding values in [0, 2**32); returns x."""
    x.bitwise_xor_(x >> 16)
    x.mul_(MIX_MUL[0]).bitwise_and_(MASK32)
    x.bitwise_xor_(x >> 15)
    x.mul_(MIX_MUL[1]).bitwise_and_(MASK32)
    return x.bitwise_xor_(x >> 15)


def position_keys(pos: torch.Tensor, lane: int) -> torch.Tensor:
    """g for int64 positions `pos` (>= 0) in lane `lane`: a new tensor with values in [0, 2**32)."""
    lo, hi = pos & MASK32, pos >> 32
    g = lo.mul_(POS_LO[lane]).bitwise_and_(MASK32)
    return g.add_(hi.mul_(POS_HI[lane]).bitwise_and_(MASK32)).add_(SEEDS[lane]).bitwise_and_(MASK32)


def fingerprint_words(words: torch.Tensor, first_pos: int, out: torch.Tensor) -> None:
    """out[l] += sum over i of mix32(words[i] ^ g_l(first_pos + i)), in place (int64, wrapping).

    `words` is a 1-D int32 tensor (a tensor's bytes); `out` an int64 [LANES] tensor on the same device. Every word is
    read. The lanes are sums, so a tensor may be digested in segments (its tail word is one) in any order.
    """
    n, chunk = words.numel(), FINGERPRINT_CHUNK.get(words.device.type, FINGERPRINT_CHUNK_DEFAULT)
    for start in range(0, n, chunk):
        w = words[start:start + chunk].to(torch.int64).bitwise_and_(MASK32)
        pos = torch.arange(first_pos + start, first_pos + start + w.numel(), dtype=torch.int64, device=w.device)
        out += torch.stack([mix32(position_keys(pos, lane).bitwise_xor_(w)).sum() for lane in range(LANES)])
