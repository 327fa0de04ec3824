"""Triton implementations of the four KV page-epoch kernels and the fingerprint digest (semantics:
`vradix.kernels.reference`).

On CPU they run only under `TRITON_INTERPRET=1`, which must be set before this module is imported; the dispatch never
picks them for CPU tensors on its own. Under the interpreter each program is a numpy step, so block sizes are large.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from vradix.kernels.reference import MIX_MUL, NO_VIOLATION, POS_HI, POS_LO, SEEDS, runs_of

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
_BLOCK = 1 << 16 if _INTERPRET else 1024
_ROW_BLOCK = 1 << 14 if _INTERPRET else 1024
_NO_KEY = 2 ** 62
_WORD_BLOCK = 1 << 16 if _INTERPRET else 4096


@triton.jit
def _stamp_kernel(page_epoch_ptr, loc_ptr, n, epoch, page_size, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    loc = tl.load(loc_ptr + offs, mask=m, other=0).to(tl.int64)
    tl.store(page_epoch_ptr + loc // page_size, tl.full((BLOCK,), epoch, tl.int32), mask=m)


@triton.jit
def _verify_kernel(page_epoch_ptr, r2t_ptr, r2t_stride, rows_ptr, prefix_lens_ptr, expected_ptr, out_ptr, width,
                   page_size, NO_KEY: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    plen = tl.load(prefix_lens_ptr + i).to(tl.int64)
    m = offs < plen
    row = tl.load(rows_ptr + i).to(tl.int64)
    expected = tl.load(expected_ptr + i).to(tl.int32)
    slots = tl.load(r2t_ptr + row * r2t_stride + offs, mask=m, other=0).to(tl.int64)
    epochs = tl.load(page_epoch_ptr + slots // page_size, mask=m, other=0)
    bad = m & (epochs != expected)
    count = tl.sum(bad.to(tl.int64), axis=0)
    key = tl.min(tl.where(bad, i * width + offs, NO_KEY), axis=0)
    tl.atomic_add(out_ptr, count, mask=count > 0)
    tl.atomic_min(out_ptr + 1, key, mask=count > 0)


@triton.jit
def _rows_outside_kernel(page_epoch_ptr, r2t_ptr, r2t_stride, meta_ptr, n, out_ptr, page_size,
                         BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    row = tl.load(meta_ptr + i)
    length = tl.load(meta_ptr + n + i)
    lo = tl.load(meta_ptr + 2 * n + i)
    hi = tl.load(meta_ptr + 3 * n + i)
    m = offs < length
    slots = tl.load(r2t_ptr + row * r2t_stride + offs, mask=m, other=0).to(tl.int64)
    epochs = tl.load(page_epoch_ptr + slots // page_size, mask=m, other=0).to(tl.int64)
    count = tl.sum((m & ((epochs < lo) | (epochs > hi))).to(tl.int64), axis=0)
    tl.atomic_add(out_ptr + i, count, mask=count > 0)


@triton.jit
def _row_epochs_kernel(page_epoch_ptr, r2t_ptr, r2t_stride, row, length, page_size, out_ptr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < length
    slots = tl.load(r2t_ptr + row * r2t_stride + offs, mask=m, other=0).to(tl.int64)
    tl.store(out_ptr + offs, tl.load(page_epoch_ptr + slots // page_size, mask=m, other=0), mask=m)


@triton.jit
def _stale_mask(page_epoch_ptr, pinned_ptr, offs, n, epoch, HAS_PIN: tl.constexpr):
    m = offs < n
    e = tl.load(page_epoch_ptr + offs, mask=m, other=-1)
    stale = m & (e >= 0) & (e < epoch)
    if HAS_PIN:
        stale = stale & (tl.load(pinned_ptr + offs, mask=m, other=1) == 0)
    return stale


@triton.jit
def _count_stale_kernel(page_epoch_ptr, pinned_ptr, n, epoch, counts_ptr, HAS_PIN: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    stale = _stale_mask(page_epoch_ptr, pinned_ptr, offs, n, epoch, HAS_PIN)
    tl.store(counts_ptr + tl.program_id(0), tl.sum(stale.to(tl.int64), axis=0))


@triton.jit
def _scatter_stale_kernel(page_epoch_ptr, pinned_ptr, n, epoch, starts_ptr, out_ptr, HAS_PIN: tl.constexpr,
                          BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    stale = _stale_mask(page_epoch_ptr, pinned_ptr, offs, n, epoch, HAS_PIN).to(tl.int64)
    dest = tl.load(starts_ptr + tl.program_id(0)) + tl.cumsum(stale, axis=0) - stale
    tl.store(out_ptr + dest, offs.to(tl.int64), mask=stale > 0)


# The fingerprint's constants, as globals the kernels read at compile time. Each meets a uint32 operand, so the
# arithmetic is uint32 (literals below 2**31 are int32, and int32 with uint32 promotes to uint32).
MIX_A, MIX_B = (tl.constexpr(c) for c in MIX_MUL)
POS_LO0, POS_LO1, POS_LO2, POS_LO3 = (tl.constexpr(c) for c in POS_LO)
POS_HI0, POS_HI1, POS_HI2, POS_HI3 = (tl.constexpr(c) for c in POS_HI)
SEED0, SEED1, SEED2, SEED3 = (tl.constexpr(c) for c in SEEDS)


@triton.jit
def _mix32(x):
    x = x ^ (x >> 16)
    x = x * MIX_A
    x = x ^ (x >> 15)
    x = x * MIX_B
    return x ^ (x >> 15)


@triton.jit
def _lane_sum(w, lo, hi, m, pos_lo, pos_hi, seed):
    """One lane's partial sum; uint32 arithmetic wraps mod 2**32 exactly like the reference's masked int64."""
    g = lo * pos_lo + hi * pos_hi + seed
    return tl.sum(tl.where(m, _mix32(w ^ g), 0).to(tl.int64), axis=0)


@triton.jit
def _fingerprint_kernel(words_ptr, n, first_pos, out_ptr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    w = tl.load(words_ptr + offs, mask=m, other=0).to(tl.uint32, bitcast=True)
    pos = offs + first_pos
    lo = pos.to(tl.uint32)  # truncation: the low 32 bits
    hi = (pos >> 32).to(tl.uint32)
    tl.atomic_add(out_ptr + 0, _lane_sum(w, lo, hi, m, POS_LO0, POS_HI0, SEED0))
    tl.atomic_add(out_ptr + 1, _lane_sum(w, lo, hi, m, POS_LO1, POS_HI1, SEED1))
    tl.atomic_add(out_ptr + 2, _lane_sum(w, lo, hi, m, POS_LO2, POS_HI2, SEED2))
    tl.atomic_add(out_ptr + 3, _lane_sum(w, lo, hi, m, POS_LO3, POS_HI3, SEED3))



def stamp(page_epoch: torch.Tensor, loc: torch.Tensor, epoch: int, page_size: int) -> None:
    n = loc.numel()
    if n:
        _stamp_kernel[(triton.cdiv(n, _BLOCK),)](page_epoch, loc.contiguous(), n, epoch, page_size, BLOCK=_BLOCK)


def rows_outside_epochs(page_epoch, req_to_token, meta, width, page_size):
    """`reference.rows_outside_epochs` in one launch (plus the zeroed output)."""
    n = meta.shape[1]
    out = torch.zeros(n, dtype=torch.int64, device=page_epoch.device)
    grid = (n, triton.cdiv(width, _ROW_BLOCK))
    _rows_outside_kernel[grid](page_epoch, req_to_token, req_to_token.stride(0), meta.contiguous(), n, out,
                               page_size, BLOCK=_ROW_BLOCK)
    return out


def verify(page_epoch, req_to_token, rows, prefix_lens, expected_epochs, page_size, max_prefix_len):
    out = torch.tensor([0, _NO_KEY], dtype=torch.int64, device=page_epoch.device)
    n, width = rows.numel(), max_prefix_len
    if n and width:
        grid = (n, triton.cdiv(width, _ROW_BLOCK))
        _verify_kernel[grid](page_epoch, req_to_token, req_to_token.stride(0), rows.contiguous(),
                             prefix_lens.contiguous(), expected_epochs.contiguous(), out, req_to_token.shape[1],
                             page_size, NO_KEY=_NO_KEY, BLOCK=_ROW_BLOCK)
    return _decode_first(out, req_to_token.shape[1])


def _decode_first(out: torch.Tensor, width: int) -> torch.Tensor:
    """[count, key] -> [count, i, pos] without a host sync."""
    key = out[1]
    found = key != _NO_KEY
    i = torch.where(found, key // width, NO_VIOLATION)
    pos = torch.where(found, key % width, NO_VIOLATION)
    return torch.stack([out[0], i, pos])


def row_epochs(page_epoch, req_to_token, row, length, page_size) -> torch.Tensor:
    out = torch.empty(length, dtype=page_epoch.dtype, device=page_epoch.device)
    if length > 0:
        _row_epochs_kernel[(triton.cdiv(length, _ROW_BLOCK),)](page_epoch, req_to_token, req_to_token.stride(0), row,
                                                                length, page_size, out, BLOCK=_ROW_BLOCK)
    return out


def spans(page_epoch, req_to_token, row, length, page_size):
    if length <= 0:
        return []
    return runs_of(row_epochs(page_epoch, req_to_token, row, length, page_size))


def invalidate(page_epoch: torch.Tensor, epoch: int, pinned_mask: torch.Tensor | None) -> torch.Tensor:
    n = page_epoch.numel()
    blocks = triton.cdiv(n, _BLOCK) if n else 0
    if blocks == 0:
        return torch.empty(0, dtype=torch.int64, device=page_epoch.device)
    has_pin = pinned_mask is not None
    pinned = pinned_mask.contiguous().view(torch.uint8) if pinned_mask is not None else page_epoch
    counts = torch.empty(blocks, dtype=torch.int64, device=page_epoch.device)
    _count_stale_kernel[(blocks,)](page_epoch, pinned, n, epoch, counts, HAS_PIN=has_pin, BLOCK=_BLOCK)
    ends = torch.cumsum(counts, 0)
    total = int(ends[-1].item())
    out = torch.empty(total, dtype=torch.int64, device=page_epoch.device)
    if total:
        _scatter_stale_kernel[(blocks,)](page_epoch, pinned, n, epoch, ends - counts, out, HAS_PIN=has_pin,
                                         BLOCK=_BLOCK)
    return out


def fingerprint_words(words: torch.Tensor, first_pos: int, out: torch.Tensor) -> None:
    n = words.numel()
    if n:
        _fingerprint_kernel[(triton.cdiv(n, _WORD_BLOCK),)](words, n, first_pos, out, BLOCK=_WORD_BLOCK)
