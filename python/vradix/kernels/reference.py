"""Torch reference implementations of the four KV page-epoch kernels.

These define the semantics; the Triton (`triton_impl`) and CUDA (`vradix._C`) implementations must return identical
results (the tests compare them on the same inputs). Conventions shared by all three:

* `page_epoch` is an int32 tensor with one entry per KV page of the token pool (page = slot // page_size); `FREE`
  (-1) marks a page the allocator owns, a value >= 0 is the weight epoch of the forward pass that last wrote it.
* `req_to_token` is SGLang's `ReqToTokenPool.req_to_token` (int32 or int64, [rows, max_context]) or any 2-D table of
  KV slots laid out the same way.
"""
from __future__ import annotations

import torch

FREE = -1
NO_VIOLATION = -1


def stamp(page_epoch: torch.Tensor, loc: torch.Tensor, epoch: int, page_size: int) -> None:
    """page_epoch[loc // page_size] = epoch, in place (duplicate pages in `loc` are fine)."""
    if loc.numel() == 0:
        return
    page_epoch.index_fill_(0, (loc.to(torch.int64) // page_size), epoch)


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


def row_epochs(page_epoch: torch.Tensor, req_to_token: torch.Tensor, row: int, length: int,
               page_size: int) -> torch.Tensor:
    """The epoch of each of the first `length` positions of `row` (int32, [length])."""
    slots = req_to_token[row, :length].to(torch.int64)
    return page_epoch[slots // page_size]


def spans(page_epoch: torch.Tensor, req_to_token: torch.Tensor, row: int, length: int,
          page_size: int) -> list[tuple[int, int, int]]:
    """Run-length provenance of one row: [(epoch, start, end)] covering [0, length), end exclusive."""
    if length <= 0:
        return []
    return runs_of(row_epochs(page_epoch, req_to_token, row, length, page_size))


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
