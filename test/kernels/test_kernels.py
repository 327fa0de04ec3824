"""The four KV page-epoch kernels: every available implementation equals the torch reference.

On CPU that is Triton under TRITON_INTERPRET=1 (test/conftest.py turns it on, unless the environment sets it, before
anything imports Triton) against the torch reference; on a CUDA machine (benchmark/gpu_check/gpu_check.sh) the CUDA extension and Triton on the GPU join in. A
few known answers pin the reference itself.
"""
import pytest
import torch

from vradix import kernels
from vradix.kernels import FREE, reference

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
PAGE_SIZES = [1, 16, 64]


def impls(device):
    return [i for i in ("triton", "cuda") if kernels.available(i, torch.device(device))]


def cases(device):
    return [(d, i) for d in DEVICES for i in impls(d)] if device is None else [(device, i) for i in impls(device)]


CASES = cases(None)
assert CASES, "no kernel implementation besides the torch reference is testable here (Triton must be importable)"


def random_table(num_pages, seed, lo=-1, hi=5, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(lo, hi, (num_pages,), generator=g, dtype=torch.int32).to(device)


def random_rows(num_pages, page_size, rows, ctx, seed, dtype=torch.int32, device="cpu"):
    g = torch.Generator().manual_seed(seed + 1)
    return torch.randint(0, num_pages * page_size, (rows, ctx), generator=g).to(dtype).to(device)


# ---- known answers (the reference is the spec) ----------------------------------------------------------------------
def test_reference_known_answers():
    pe = torch.tensor([FREE, 3, 3, 4, FREE, 2], dtype=torch.int32)
    r2t = torch.tensor([[2, 3, 4, 5, 6, 7, 0, 0], [10, 11, 2, 3, 0, 0, 0, 0]], dtype=torch.int32)  # page_size 2
    reference.stamp(pe, torch.tensor([8, 9]), 7, 2)
    assert pe.tolist() == [FREE, 3, 3, 4, 7, 2]
    out = reference.verify(pe, r2t, torch.tensor([0, 1]), torch.tensor([4, 4]), torch.tensor([3, 2]), 2)
    # row 0: pages 1,1,2,2 -> all epoch 3, fine; row 1: pages 5,5 (epoch 2, fine), 1,1 (epoch 3 != 2) -> 2 bad at pos 2
    assert out.tolist() == [2, 1, 2]
    assert reference.spans(pe, r2t, 0, 6, 2) == [(3, 0, 4), (4, 4, 6)]
    assert reference.invalidate(pe, 4, None).tolist() == [1, 2, 5]
    assert reference.invalidate(pe, 4, torch.tensor([0, 1, 0, 0, 0, 0], dtype=torch.bool)).tolist() == [2, 5]


# ---- stamp ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("device,impl", CASES)
@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("n_loc", [0, 1, 37, 5000])
def test_stamp_matches_reference(device, impl, page_size, n_loc):
    num_pages = 3000
    base = random_table(num_pages, seed=n_loc + page_size, device=device)
    loc = torch.randint(0, num_pages * page_size, (n_loc,), generator=torch.Generator().manual_seed(3)).to(device)
    want, got = base.clone().cpu(), base.clone()
    reference.stamp(want, loc.cpu(), 9, page_size)
    kernels.stamp(got, loc, 9, page_size, impl=impl)
    assert torch.equal(got.cpu(), want)


@pytest.mark.parametrize("device,impl", CASES)
def test_stamp_free_and_int32_loc(device, impl):
    pe = torch.full((100,), 2, dtype=torch.int32, device=device)
    kernels.stamp(pe, torch.tensor([16, 17, 40], dtype=torch.int32, device=device), FREE, 16, impl=impl)
    assert pe.cpu().tolist() == [2] + [FREE, FREE] + [2] * 97


# ---- verify ---------------------------------------------------------------------------------------------------------
def corrupted_batch(num_pages, page_size, n_rows, ctx, corrupt, seed, device, dtype=torch.int32):
    """Rows whose prefix pages all carry their expected epoch, then `corrupt` positions flipped to another epoch."""
    g = torch.Generator().manual_seed(seed)
    expected = torch.randint(0, 4, (n_rows,), generator=g, dtype=torch.int32)
    page_epoch = torch.full((num_pages,), FREE, dtype=torch.int32)
    per_row = (ctx + page_size - 1) // page_size
    pages = (torch.randperm(num_pages - 1, generator=g)[: n_rows * per_row] + 1).view(n_rows, per_row)
    for i in range(n_rows):
        page_epoch[pages[i]] = expected[i]
    slots = (pages.repeat_interleave(page_size, dim=1) * page_size
             + torch.arange(page_size).repeat(pages.shape[1]))[:, :ctx]
    prefix_lens = torch.randint(0, ctx + 1, (n_rows,), generator=g)
    if n_rows:
        prefix_lens[0] = ctx  # one full row so the grid covers the whole width
    for _ in range(corrupt):
        i = int(torch.randint(0, n_rows, (1,), generator=g))
        if prefix_lens[i] == 0:
            continue
        p = int(torch.randint(0, int(prefix_lens[i]), (1,), generator=g))
        page_epoch[slots[i, p] // page_size] = expected[i] + 1
    table = torch.zeros((n_rows + 3, ctx + 5), dtype=dtype)  # rows scattered inside a larger pool
    rows = torch.randperm(n_rows + 3, generator=g)[:n_rows]
    table[rows, :ctx] = slots.to(dtype)
    return [t.to(device) for t in (page_epoch, table, rows, prefix_lens, expected)]


@pytest.mark.parametrize("device,impl", CASES)
@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("n_rows,ctx,corrupt", [(0, 8, 0), (1, 1, 0), (1, 1, 1), (7, 300, 0), (7, 300, 5),
                                                (33, 2049, 40)])
def test_verify_matches_reference(device, impl, page_size, n_rows, ctx, corrupt):
    num_pages = max(64, n_rows * (ctx // page_size + 2) + 8)
    args = corrupted_batch(num_pages, page_size, n_rows, ctx, corrupt, seed=n_rows * 31 + ctx + page_size,
                           device=device)
    want = reference.verify(*[a.cpu() for a in args], page_size).tolist()
    got = kernels.verify(*args, page_size, impl=impl)
    assert list(got) == want
    if corrupt == 0:
        assert want[0] == 0 and want[1] == -1


@pytest.mark.parametrize("device,impl", CASES)
def test_verify_int64_table_and_unfound_first(device, impl):
    args = corrupted_batch(400, 16, 5, 100, 3, seed=7, device=device, dtype=torch.int64)
    want = reference.verify(*[a.cpu() for a in args], 16).tolist()
    assert want[0] > 0
    assert list(kernels.verify(*args, 16, impl=impl)) == want


# ---- rows_outside_epochs (the backstop's per-row verdict) ----------------------------------------------------------
@pytest.mark.parametrize("device,impl", CASES + [(d, "torch") for d in DEVICES])
@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("n_rows,ctx", [(1, 1), (7, 300), (33, 2049)])
def test_rows_outside_epochs_matches_the_host_form(device, impl, page_size, n_rows, ctx):
    """Per row, the positions outside its [lo, hi] epoch range (a FREE page is outside every range): the device
    forms (torch reference, Triton; the CUDA extension's pick runs Triton) return a tensor nobody has read, equal to
    the host form's list."""
    num_pages = n_rows * (ctx // page_size + 2) + 8
    pe = random_table(num_pages, seed=n_rows + ctx, lo=-1, hi=4, device=device)
    table = random_rows(num_pages, page_size, n_rows + 2, ctx + 3, seed=ctx, device=device)
    g = torch.Generator().manual_seed(page_size)
    rows = torch.randperm(n_rows + 2, generator=g)[:n_rows].tolist()
    lens = torch.randint(0, ctx + 1, (n_rows,), generator=g).tolist()
    lo = torch.randint(0, 3, (n_rows,), generator=g).tolist()
    hi = [a + int(b) for a, b in zip(lo, torch.randint(0, 2, (n_rows,), generator=g))]
    want = reference.host_rows_outside_epochs(pe.cpu(), table.cpu(), rows, lens, lo, hi, page_size)
    got = kernels.rows_outside_epochs(pe, table, rows, lens, lo, hi, page_size, impl=impl)
    assert isinstance(got, torch.Tensor) and got.device.type == torch.device(device).type
    assert got.tolist() == want
    assert sum(want) > 0 or n_rows == 1  # the random table does put pages outside the ranges


# ---- spans ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("device,impl", CASES)
@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("length", [0, 1, 17, 4000])
def test_spans_match_reference(device, impl, page_size, length):
    num_pages = 2048
    pe = random_table(num_pages, seed=length, lo=0, hi=3, device=device)
    # runs: consecutive positions on the same page share an epoch; random pages make ragged runs
    r2t = random_rows(num_pages, page_size, 4, 4096, seed=length + page_size, device=device)
    want = reference.spans(pe.cpu(), r2t.cpu(), 2, length, page_size)
    assert kernels.spans(pe, r2t, 2, length, page_size, impl=impl) == want
    if length:
        assert want[0][1] == 0 and want[-1][2] == length
        assert all(a[2] == b[1] and a[0] != b[0] for a, b in zip(want, want[1:]))


# ---- invalidate -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("device,impl", CASES)
@pytest.mark.parametrize("num_pages", [0, 1, 1000, 100_000])
@pytest.mark.parametrize("pinned", [False, True])
def test_invalidate_matches_reference(device, impl, num_pages, pinned):
    pe = random_table(num_pages, seed=num_pages, lo=-1, hi=6, device=device)
    mask = (torch.rand(num_pages, generator=torch.Generator().manual_seed(5)) < 0.3).to(device) if pinned else None
    want = reference.invalidate(pe.cpu(), 4, None if mask is None else mask.cpu())
    got = kernels.invalidate(pe, 4, mask, impl=impl)
    assert torch.equal(got.cpu(), want)
    if num_pages >= 1000:
        assert 0 < want.numel() < num_pages


# ---- bind: a ledger's kernels, resolved once ---------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
def test_bind_hands_out_each_implementations_own_functions(device):
    """What a ledger calls is the chosen implementation's function itself (the audit's `invalidate`, the forward's
    `stamp`): no wrapper of this package's dispatch stands between them."""
    pe = torch.zeros(4, dtype=torch.int32, device=device)
    own = {"torch": reference, "triton": kernels.triton_module(), "cuda": kernels.cuda_ext()}
    for impl in ["torch"] + impls(device):
        bound = kernels.bind(pe, impl)
        assert (bound.name, bound.host) == (impl, False)
        assert bound.invalidate is own[impl].invalidate and bound.stamp is own[impl].stamp
        assert bound.verify is own[impl].verify


def test_bind_reads_the_setting_once_and_fails_early(monkeypatch):
    """`auto` on CPU binds the host forms; a binding made is a value that a later `VRADIX_KERNELS` does not reach; a
    forced implementation the device lacks fails at `bind` (a ledger's attach), not at a first kernel call."""
    pe = torch.zeros(4, dtype=torch.int32)
    monkeypatch.delenv("VRADIX_KERNELS", raising=False)
    auto = kernels.bind(pe)
    assert (auto.name, auto.host) == ("torch", True)
    assert auto.stamp is reference.host_stamp and auto.rows_outside_epochs is reference.host_rows_outside_epochs
    assert auto.invalidate is reference.invalidate
    monkeypatch.setenv("VRADIX_KERNELS", "torch")
    assert auto.stamp is reference.host_stamp
    assert kernels.bind(pe).stamp is reference.stamp  # a new binding sees the new setting: the device forms
    monkeypatch.setenv("VRADIX_KERNELS", "cuda")
    with pytest.raises(RuntimeError, match="'cuda' is not available for cpu tensors"):
        kernels.bind(pe)


def test_dispatch_rejects_unknown_and_unavailable():
    pe = torch.zeros(4, dtype=torch.int32)
    with pytest.raises(ValueError, match="unknown kernel implementation"):
        kernels.stamp(pe, torch.tensor([1]), 1, 1, impl="opencl")
    if kernels.cuda_ext() is None or not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="not available"):
            kernels.stamp(pe, torch.tensor([1]), 1, 1, impl="cuda")
    assert kernels.impl_for(pe) == "torch"  # CPU tensors never pick the interpreter on their own
