"""Weight fingerprint (`vradix.kernels.fingerprint`): a full-content digest of a model's tensors.

The checks, in order:
* The torch reference equals an independent pure-Python statement of the digest, and the CUDA per-word digest
  (`csrc/fingerprint_digest.h`, compiled as plain C++) equals the reference.
* Triton (under TRITON_INTERPRET=1 on CPU, which test/conftest.py turns on) and, on a CUDA machine, the CUDA extension give bit-exact lanes.
* A single flipped bit, swapped words, a shift, a renamed tensor, a new shape or a reinterpreted dtype each change the
  fingerprint.
* The same content gives the same fingerprint in another tensor object, layout, item order, implementation or
  device.
* A real tiny Llama loaded twice gets one fingerprint; one with other weights gets another.
"""
import os
import shutil
import subprocess
import textwrap

import pytest
import torch

from vradix import kernels
from vradix.kernels import fingerprint as fp
from vradix.kernels import reference

M32 = 0xFFFFFFFF
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
CASES = [(d, i) for d in DEVICES for i in ("triton", "cuda") if kernels.available(i, torch.device(d))]
assert CASES, "no implementation besides the torch reference is testable here (Triton must be importable)"
ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def spec_lanes(words: list[int], first_pos: int) -> list[int]:
    """The digest as stated in reference.py, in Python integers (no torch, no overflow)."""
    lanes = [0] * reference.LANES
    for i, w in enumerate(words):
        pos = first_pos + i
        for lane in range(reference.LANES):
            g = ((pos & M32) * reference.POS_LO[lane] + (pos >> 32) * reference.POS_HI[lane]
                 + reference.SEEDS[lane]) & M32
            x = (w & M32) ^ g
            x ^= x >> 16
            x = (x * reference.MIX_MUL[0]) & M32
            x ^= x >> 15
            x = (x * reference.MIX_MUL[1]) & M32
            lanes[lane] += x ^ (x >> 15)
    return [(v + 2 ** 63) % 2 ** 64 - 2 ** 63 for v in lanes]  # int64 wrap


def reference_lanes(words: torch.Tensor, first_pos: int = 0) -> list[int]:
    out = torch.zeros(reference.LANES, dtype=torch.int64)
    reference.fingerprint_words(words.cpu(), first_pos, out)
    return out.tolist()


def random_words(n: int, seed: int) -> torch.Tensor:
    return torch.randint(-2 ** 31, 2 ** 31, (n,), generator=torch.Generator().manual_seed(seed), dtype=torch.int32)


def random_tensor(shape, dtype, seed: int, device="cpu") -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype).to(device)
    info = torch.iinfo(dtype)
    return torch.randint(info.min, info.max, shape, generator=g, dtype=dtype).to(device)


# ---- the reference is the spec --------------------------------------------------------------------------------------
@pytest.mark.parametrize("first_pos", [0, 2 ** 32 - 37, 5 * 2 ** 32 + 11])
def test_reference_equals_the_python_spec_across_chunks_and_the_32_bit_position_boundary(monkeypatch, first_pos):
    monkeypatch.setitem(reference.FINGERPRINT_CHUNK, "cpu", 7)  # many chunks, a ragged last one
    words = random_words(100, seed=first_pos % 1000)
    assert reference_lanes(words, first_pos) == spec_lanes(words.tolist(), first_pos)


def test_mix32_avalanches():
    """Flipping any input bit flips each output bit with probability 1/2 (measured 0.004 at worst on 2e5 inputs)."""
    x = torch.randint(0, 2 ** 32, (20000,), generator=torch.Generator().manual_seed(0), dtype=torch.int64)
    h = reference.mix32(x.clone())
    bits = torch.arange(32)
    for i in range(32):
        flipped = h ^ reference.mix32(x ^ (1 << i))
        p = ((flipped[:, None] >> bits) & 1).double().mean(0)
        assert (p - 0.5).abs().max() < 0.03, (i, p)


def test_known_fingerprint_pins_the_definition():
    """Engines of different vradix versions compare fingerprints: a change here must come with a new fp.VERSION."""
    w, b = torch.arange(10, dtype=torch.float32).reshape(2, 5), torch.tensor([1, 2, 3], dtype=torch.int8)
    items = [("w", w), ("b", b)]
    assert fp.VERSION == b"vradix-weight-fingerprint-v1"
    assert fp.tensor_lanes(w).tolist() == spec_lanes(w.view(torch.int32).flatten().tolist(), 0)
    assert fp.tensor_lanes(b).tolist() == spec_lanes([1 | 2 << 8 | 3 << 16], 0)  # little-endian, zero-padded
    assert fp.fingerprint_named_tensors(items) == "d6c977bf228eba12c76bed653baa8b7c"


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ to compile the CUDA digest header as C++")
def test_cuda_digest_header_equals_the_reference(tmp_path):
    """csrc/fingerprint_digest.h is the CUDA kernel's per-word arithmetic; as host C++ it must give the same lanes."""
    src = tmp_path / "digest.cpp"
    src.write_text(textwrap.dedent("""
        #include <cstdio>
        #include "fingerprint_digest.h"
        int main() {
          long long first; unsigned long long acc[vradix_fp::kLanes] = {0, 0, 0, 0}; unsigned w;
          if (scanf("%lld", &first) != 1) return 1;
          for (long long i = 0; scanf("%u", &w) == 1; ++i) vradix_fp::digest_word(w, first + i, acc);
          for (int l = 0; l < vradix_fp::kLanes; ++l) printf("%lld\\n", (long long)acc[l]);
        }"""))
    exe = tmp_path / "digest"
    subprocess.run(["g++", "-O2", "-std=c++17", "-I", os.path.join(ROOT, "csrc"), str(src), "-o", str(exe)],
                   check=True, timeout=120)
    for first_pos in (0, 2 ** 32 - 3):
        words = random_words(3000, seed=first_pos % 97)
        stdin = f"{first_pos} " + " ".join(str(w & M32) for w in words.tolist())
        out = subprocess.run([str(exe)], input=stdin, capture_output=True, text=True, check=True, timeout=60).stdout
        assert [int(v) for v in out.split()] == reference_lanes(words, first_pos)


# ---- every implementation equals the reference ----------------------------------------------------------------------
@pytest.mark.parametrize("device,impl", CASES)
@pytest.mark.parametrize("dtype,shape", [
    (torch.float32, (0,)), (torch.float32, ()), (torch.float32, (257, 33)), (torch.float32, (70001,)),
    (torch.bfloat16, (5,)), (torch.bfloat16, (64, 129)), (torch.float16, (3, 7, 11)),
    (torch.int8, (3,)), (torch.int8, (1001,)), (torch.uint8, (1,)), (torch.uint8, (4099,)),
])
def test_implementation_equals_reference(device, impl, dtype, shape):
    t = random_tensor(shape, dtype, seed=sum(shape) + 1, device=device)
    assert fp.tensor_lanes(t, impl=impl).tolist() == fp.tensor_lanes(t.cpu(), impl="torch").tolist()


@pytest.mark.parametrize("device,impl", CASES)
@pytest.mark.parametrize("first_pos", [0, 2 ** 32 - 1000, 3 * 2 ** 32])
def test_implementation_equals_reference_at_large_positions(device, impl, first_pos):
    words = random_words(2000, seed=3)
    out = torch.zeros(reference.LANES, dtype=torch.int64, device=device)
    fp.digest_words(words.to(device), first_pos, out, impl=impl)
    assert out.tolist() == reference_lanes(words, first_pos)


# ---- sensitivity ----------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def big():
    """A 4 MiB float32 weight and its fingerprint."""
    t = random_tensor((1024, 1024), torch.float32, seed=11)
    return t, fp.tensor_lanes(t), fp.fingerprint_named_tensors([("layer.weight", t)])


@pytest.mark.parametrize("index,bit", [(0, 0), (777_777, 13), (1024 * 1024 - 1, 31)])
def test_a_single_bit_flip_changes_every_lane(big, index, bit):
    t, lanes, whole = big
    flipped = t.clone().view(-1).view(torch.int32)
    flipped[index] ^= (1 << bit) - (1 << 32 if bit == 31 else 0)  # as an int32
    flipped = flipped.view(torch.float32).view(1024, 1024)
    assert not torch.equal(flipped.view(torch.int32), t.view(torch.int32))
    new = fp.tensor_lanes(flipped)
    assert all(a != b for a, b in zip(new.tolist(), lanes.tolist()))
    assert fp.fingerprint_named_tensors([("layer.weight", flipped)]) != whole


def test_swapped_words_and_a_shift_change_the_fingerprint(big):
    t, lanes, whole = big
    swapped = t.clone().view(-1)
    swapped[[10, 500_000]] = swapped[[500_000, 10]]
    shifted = torch.roll(t.view(-1), 1)
    for other in (swapped, shifted):
        assert fp.fingerprint_named_tensors([("layer.weight", other.view(1024, 1024))]) != whole
        assert all(a != b for a, b in zip(fp.tensor_lanes(other).tolist(), lanes.tolist()))


def test_name_shape_and_dtype_are_part_of_the_fingerprint(big):
    t, lanes, whole = big
    reinterpreted = t.view(torch.int32)
    assert fp.tensor_lanes(reinterpreted).tolist() == lanes.tolist()  # same bytes: the lanes are content only
    assert fp.fingerprint_named_tensors([("layer.weight", reinterpreted)]) != whole
    assert fp.fingerprint_named_tensors([("layer.weight", t.view(-1))]) != whole
    assert fp.fingerprint_named_tensors([("layer.weight", t.view(2048, 512))]) != whole
    assert fp.fingerprint_named_tensors([("layer.bias", t)]) != whole
    assert fp.fingerprint_named_tensors([("layer.weight", t), ("extra", torch.zeros(0))]) != whole


def test_odd_sized_tail_bytes_are_read():
    t = random_tensor((7,), torch.bfloat16, seed=5)  # 14 bytes: three words and a half-filled tail word
    changed = t.clone()
    changed[-1] = -changed[-1]
    assert fp.fingerprint_named_tensors([("x", t)]) != fp.fingerprint_named_tensors([("x", changed)])
    b = torch.tensor([1, 2, 3, 4, 5], dtype=torch.uint8)
    assert fp.fingerprint_named_tensors([("x", b)]) != fp.fingerprint_named_tensors([("x", b + (b == 5))])


# ---- stability ------------------------------------------------------------------------------------------------------
def test_same_content_same_fingerprint_in_any_object_layout_or_order():
    a = random_tensor((96, 40), torch.bfloat16, seed=1)
    b = random_tensor((33,), torch.int8, seed=2)
    want = fp.fingerprint_named_tensors([("a", a), ("b", b)])
    assert fp.fingerprint_named_tensors([("b", b.clone()), ("a", a.clone())]) == want
    a_t = a.t().contiguous().t()  # same values, column-major strides
    assert not a_t.is_contiguous()
    assert fp.fingerprint_named_tensors([("a", a_t), ("b", b)]) == want
    wide = torch.cat([torch.zeros(1, dtype=torch.bfloat16), a.view(-1)])[1:].view(96, 40)  # 2-byte storage offset
    assert wide.storage_offset() == 1
    assert fp.fingerprint_named_tensors([("a", wide), ("b", b)]) == want
    assert fp.fingerprint_named_tensors([("a", a), ("b", b)]) == want  # and again
    for device, impl in CASES:
        assert fp.fingerprint_named_tensors([("a", a.to(device)), ("b", b.to(device))], impl=impl) == want


def test_non_contiguous_slice_equals_its_contiguous_copy():
    base = random_tensor((64, 48), torch.float16, seed=9)
    view = base[::2, 1::3]
    assert not view.is_contiguous()
    assert fp.tensor_lanes(view).tolist() == fp.tensor_lanes(view.contiguous()).tolist()
    for device, impl in CASES:
        assert fp.tensor_lanes(view.to(device), impl=impl).tolist() == fp.tensor_lanes(view.contiguous()).tolist()


def test_repeated_names_are_rejected():
    with pytest.raises(ValueError, match="appears twice"):
        fp.fingerprint_named_tensors([("w", torch.zeros(2)), ("w", torch.ones(2))])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="device-to-host reads exist only with an accelerator")
def test_digesting_never_synchronises_until_the_one_host_read():
    tensors = [random_tensor((1000, 37), torch.bfloat16, seed=s, device="cuda") for s in range(5)]
    torch.cuda.set_sync_debug_mode("error")
    try:
        lanes = [fp.tensor_lanes(t) for t in tensors]
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.equal(torch.stack(lanes).cpu(), fp.lanes_on_host(tensors))


# ---- a real model ---------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    pytest.importorskip("transformers")  # in the project's venv; benchmark/gpu_check/gpu_check.sh may run without it
    from vradix.testing.models.llama import generate
    d = tmp_path_factory.mktemp("fingerprint_models")
    return (generate(str(d / "A"), seed=1, dtype="float32", init_range=0.2),
            generate(str(d / "B"), seed=2, dtype="float32", init_range=0.2))


def test_tiny_model_loaded_twice_has_one_fingerprint_and_other_weights_another(tiny_models):
    from transformers import LlamaForCausalLM
    a, b = tiny_models
    first, second = LlamaForCausalLM.from_pretrained(a), LlamaForCausalLM.from_pretrained(a)
    other = LlamaForCausalLM.from_pretrained(b)
    want = fp.fingerprint_module(first)
    assert len(want) == fp.HEX_CHARS and int(want, 16) >= 0
    assert fp.fingerprint_module(second) == want
    assert fp.fingerprint_module(other) != want
    names = {n for n, _ in first.named_parameters()} | {n for n, _ in first.named_buffers()}
    assert "lm_head.weight" in names and any(n.endswith("inv_freq") for n in names)
    with torch.no_grad():
        second.model.layers[1].mlp.down_proj.weight[17, 3] += 1e-3
    assert fp.fingerprint_module(second) != want
    for device, impl in CASES:
        assert fp.fingerprint_module(first.to(device), impl=impl) == want
