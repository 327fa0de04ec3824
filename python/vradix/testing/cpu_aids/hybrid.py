"""CPU aids for Mamba2 hybrid models (NemotronH) on SGLang's CPU engine: test and demo only, never a product path.

SGLang 0.5.23 has no CPU implementation of the Mamba2 mixer's kernels: `layers/attention/mamba/mamba.py` binds
`causal_conv1d_fn` / `causal_conv1d_update` only on CUDA/NPU/XPU, and its SSD scan (`mamba_chunk_scan_combined`) and
single-step update (`selective_state_update`) are Triton. For every mamba-type model the attention registry also
imports the GDN/KDA backends, which on the CPU engine import `sgl_kernel.mamba.*_cpu` and look up
`torch.ops.sgl_kernel.*_cpu` ops that only a CPU (AMX) build of sgl-kernel has. `apply()` supplies exactly these:
1. torch stand-ins bound into `mamba.py`'s namespace (each written against SGLang's calling convention: varlen
   batches, per-request state slots read through `cache_indices` / `state_batch_indices`, states updated in place):
   `causal_conv1d_fn`, `causal_conv1d_update` (also as their `_triton` names, which SGLang selects with a page-major
   KV layout), `mamba_chunk_scan_combined` (an exact per-token recurrence, not the chunked SSD algorithm; no
   per-chunk or tracked states), `selective_state_update`;
2. a `sgl_kernel.mamba` module whose `causal_conv1d_fn_cpu` / `causal_conv1d_update_cpu` are the stand-ins above
   and whose other names raise when called;
3. the `torch.ops.sgl_kernel` ops in IMPORT_TIME_OPS, defined only so the imports succeed: calling one raises
   (GDN/KDA models, which would call them, are not served by these aids).
Nothing in the scheduler, the radix tree, the Mamba pool or the model code is replaced.

What a CPU run therefore does not exercise: the CUDA causal-conv1d kernels and the Triton SSD/state-update kernels
(their chunked numerics, bf16 paths, the circular-buffer and speculative-decoding variants), the GDN/KDA kernels,
`--mamba-radix-cache-strategy extra_buffer` (SGLang allows it only on GPU platforms) and CUDA graphs. The per-token
scan is exact but slow: it is sized for toy prompts only.

Servers load these aids as the `sglang.srt.plugins` entry point `vradix_hybrid_cpu_aids` from the folder `plugin/`
(`PLUGIN_PATH`), which `vradix.testing.harness.server.CpuServer(hybrid=True)` puts on PYTHONPATH with HYBRID_CPU_FLAGS.
`apply()` refuses to run where CUDA is available.
"""
from __future__ import annotations

import os
import sys
import types
from typing import Optional

import torch
import torch.nn.functional as F

from vradix.testing.cpu_aids.import_time_ops import define_unavailable_ops

#: the folder to put on PYTHONPATH so a server process loads these aids as a plugin
PLUGIN_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hybrid_plugin")
#: server flags a hybrid model needs on the CPU engine: `extra_buffer` (the default) is refused off GPU platforms, and
#: `no_buffer` requires page size 1 and no overlap schedule (`arg_groups/mamba_hook.py`); 32 recurrent-state slots,
#: because SGLang otherwise sizes the state pool from the host's free memory (a tiny hybrid's scheduler held 9.7 GB)
HYBRID_CPU_FLAGS = [("--mamba-radix-cache-strategy", "no_buffer"), ("--disable-overlap-schedule",), ("--page-size", "1"),
                    ("--max-mamba-cache-size", "32")]
#: sgl_kernel CPU ops the GDN/KDA backends look up at import on the CPU engine
IMPORT_TIME_OPS = ("fused_gdn_gating_cpu", "fused_sigmoid_gating_delta_rule_update_cpu", "fused_rmsnorm_gated_cpu")
#: SGLang's marker for a padded batch entry in a state-index tensor
PAD_SLOT_ID = -1

_applied = False


def _activate(x: torch.Tensor, activation: Optional[str]) -> torch.Tensor:
    if activation in ("silu", "swish"):
        return F.silu(x)
    if activation is None:
        return x
    raise NotImplementedError(f"activation {activation!r}")


def _conv_window(window: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """Depthwise causal conv over `window` (dim, width-1+n) -> (dim, n): output t sees inputs t..t+width-1."""
    out = F.conv1d(window.unsqueeze(0).to(weight.dtype), weight.unsqueeze(1), bias, groups=weight.shape[0])
    return out.squeeze(0)


def causal_conv1d_fn(x, weight, bias=None, query_start_loc=None, cache_indices=None, has_initial_state=None,
                     conv_states=None, activation="silu", pad_slot_id=PAD_SLOT_ID, **_):
    """Torch stand-in for the varlen prefill causal conv1d. `x` (dim, total_tokens) holds the sequences of
    `query_start_loc` back to back; sequence i starts from `conv_states[cache_indices[i]]` (dim, width-1) when
    `has_initial_state[i]`, else from zeros, and its last width-1 inputs are written back to that slot. Returns
    (dim, total_tokens); padded entries (`cache_indices[i] == pad_slot_id`) are skipped."""
    dim, total = x.shape[-2], x.shape[-1]
    state_len = weight.shape[-1] - 1
    bounds = [0, total] if query_start_loc is None else query_start_loc.tolist()
    out = torch.zeros_like(x)
    for i in range(len(bounds) - 1):
        start, end = bounds[i], bounds[i + 1]
        slot = None if cache_indices is None else int(cache_indices[i])
        if slot == pad_slot_id or end == start:
            continue
        init = x.new_zeros(dim, state_len)
        if slot is not None and conv_states is not None and has_initial_state is not None and bool(has_initial_state[i]):
            init = conv_states[slot].to(x.dtype)
        window = torch.cat([init, x[..., start:end]], dim=-1)
        out[..., start:end] = _activate(_conv_window(window, weight, bias), activation).to(x.dtype)
        if slot is not None and conv_states is not None:
            conv_states[slot] = window[:, -state_len:].to(conv_states.dtype)
    return out


def causal_conv1d_update(x, conv_state, weight, bias=None, activation=None, cache_seqlens=None,
                         conv_state_indices=None, pad_slot_id=PAD_SLOT_ID, **speculative):
    """Torch stand-in for the decode causal conv1d: `x` (batch, dim) or (batch, dim, seqlen) continues each
    request's window `conv_state[conv_state_indices[b]]` (or `conv_state[b]`), which is shifted in place. Not
    supported (raises): the circular-buffer mode (`cache_seqlens`) and the speculative-decoding arguments of the
    Triton variant (intermediate windows, tree retrieval)."""
    if cache_seqlens is not None or any(v is not None for v in speculative.values()):
        raise NotImplementedError("vradix CPU aid: causal_conv1d_update with a circular buffer or speculative state")
    single = x.dim() == 2
    xs = x.unsqueeze(-1) if single else x
    state_len = weight.shape[-1] - 1
    out = torch.zeros_like(xs)
    for b in range(xs.shape[0]):
        slot = b if conv_state_indices is None else int(conv_state_indices[b])
        if slot == pad_slot_id:
            continue
        window = torch.cat([conv_state[slot, :, -state_len:].to(xs.dtype), xs[b]], dim=-1)
        out[b] = _activate(_conv_window(window, weight, bias), activation).to(xs.dtype)
        conv_state[slot] = torch.cat([conv_state[slot].to(xs.dtype), xs[b]], dim=-1)[:, -conv_state.shape[-1]:]
    return out.squeeze(-1) if single else out


def _discretize_dt(dt, dt_bias, dt_softplus, dt_limit=(0.0, float("inf"))):
    dt = dt.float()
    if dt_bias is not None:
        dt = dt + dt_bias.float()
    if dt_softplus:
        dt = F.softplus(dt)
    return dt.clamp(dt_limit[0], dt_limit[1])


def _heads_of_groups(t: torch.Tensor, nheads: int) -> torch.Tensor:
    """(..., ngroups, n) -> (..., nheads, n): head h reads group h // (nheads // ngroups)."""
    return t.float().repeat_interleave(nheads // t.shape[-2], dim=-2)


def _ssm_step(h, x_t, dt_t, A, B_t, C_t, D):
    """One recurrence step for all heads: h (nheads, headdim, dstate) -> (h', y (nheads, headdim))."""
    h = torch.exp(dt_t * A)[:, None, None] * h + (dt_t[:, None] * x_t)[:, :, None] * B_t[:, None, :]
    y = torch.einsum("hpn,hn->hp", h, C_t)
    if D is not None:
        y = y + (D[:, None] if D.dim() == 1 else D) * x_t
    return h, y


def mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                              seq_idx=None, chunk_indices=None, chunk_offsets=None, cu_seqlens=None,
                              dt_softplus=False, dt_limit=(0.0, float("inf")), out=None, return_final_states=False,
                              return_varlen_states=False, return_intermediate_states=False, state_dtype=None,
                              return_track_states=False, track_seq_idx=None, track_end_locs=None):
    """Torch stand-in for the Mamba2 SSD scan, computed as the exact per-token recurrence
    `h = exp(dt·A)·h + dt·x⊗B; y = h·C + D·x` (`dt` after bias, softplus and `dt_limit`; `y *= silu(z)` when `z`).
    Shapes as SGLang's: x (1, T, nheads, headdim), dt (1, T, nheads), B/C (1, T, ngroups, dstate); with `cu_seqlens`
    the T tokens are sequences back to back, sequence i starting from `initial_states[i]` (or zeros). Writes `out`
    and returns what the Triton kernel returns for the same flags, except that its per-chunk states are None (SGLang
    reads them only to track states for `extra_buffer`). Not supported (raises): state tracking (`track_seq_idx`,
    the `extra_buffer` strategy, which SGLang refuses on CPU anyway)."""
    if track_seq_idx is not None or track_end_locs is not None:
        raise NotImplementedError("vradix CPU aid: mamba_chunk_scan_combined state tracking (extra_buffer)")
    if x.shape[0] != 1 and cu_seqlens is not None:
        raise NotImplementedError("vradix CPU aid: cu_seqlens with batch > 1")
    nheads = x.shape[2]
    bounds = [0, x.shape[1]] if cu_seqlens is None else cu_seqlens.tolist()
    dt = _discretize_dt(dt, dt_bias, dt_softplus, dt_limit)
    Bh, Ch, A = _heads_of_groups(B, nheads), _heads_of_groups(C, nheads), A.float()
    Df = None if D is None else D.float()
    y = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    finals = []
    for b in range(x.shape[0]):
        for i in range(len(bounds) - 1):
            seq = b if cu_seqlens is None else i
            h = x.new_zeros(x.shape[2:] + (B.shape[-1],), dtype=torch.float32)
            if initial_states is not None:
                h = initial_states[seq].float().clone()
            for t in range(bounds[i], bounds[i + 1]):
                h, y[b, t] = _ssm_step(h, x[b, t].float(), dt[b, t], A, Bh[b, t], Ch[b, t], Df)
            finals.append(h)
    if z is not None:
        y = y * F.silu(z.float())
    if out is not None:
        out.copy_(y.reshape(out.shape).to(out.dtype))
    final_states = torch.stack(finals).to(state_dtype or C.dtype)
    if return_track_states:
        assert return_varlen_states, "return_track_states requires return_varlen_states (cu_seqlens mode)"
        return None, final_states, None
    if return_varlen_states:
        if return_intermediate_states:
            return (None, final_states, final_states) if return_final_states else (None, final_states)
        return (final_states, final_states) if return_final_states else final_states
    if return_intermediate_states:
        return (None, final_states) if return_final_states else None
    return final_states if return_final_states else None


def selective_state_update(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False,
                           state_batch_indices=None, pad_slot_id=PAD_SLOT_ID, out=None, disable_state_update=False,
                           intermediate_states_buffer=None, cache_steps=None, retrieve_parent_token=None,
                           intermediate_state_indices=None):
    """Torch stand-in for the Mamba2 single-token state update, in SGLang's decode layout: x/dt (batch, nheads,
    headdim), A (nheads, headdim, dstate), B/C (batch, ngroups, dstate), D/dt_bias (nheads, headdim); state row
    `state_batch_indices[b]` (or b) is advanced one step in place and `out` receives y. Not supported (raises): the
    speculative-decoding variants (`disable_state_update`, intermediate state buffers)."""
    if disable_state_update or intermediate_states_buffer is not None or x.dim() != 3:
        raise NotImplementedError("vradix CPU aid: selective_state_update for speculative decoding")
    rows = torch.arange(x.shape[0]) if state_batch_indices is None else state_batch_indices.to(torch.long)
    live = rows != pad_slot_id
    nheads = x.shape[1]
    dt = dt.float() + (0 if dt_bias is None else dt_bias.float())
    if dt_softplus:
        dt = F.softplus(dt)
    dA = torch.exp(dt[..., None] * A.float())  # (batch, nheads, headdim, dstate)
    Bh, Ch = _heads_of_groups(B, nheads), _heads_of_groups(C, nheads)
    h = state[rows[live]].float()
    h = dA[live] * h + (dt[..., None] * x.float()[..., None] * Bh[:, :, None, :])[live]
    state[rows[live]] = h.to(state.dtype)
    y = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    y[live] = torch.einsum("bhpn,bhn->bhp", h, Ch[live])
    if D is not None:
        y = y + D.float() * x.float()
    if z is not None:
        y = y * F.silu(z.float())
    y = y.to(x.dtype)
    if out is not None:
        out.copy_(y.reshape(out.shape))
    return y


def _unavailable(name):
    def op(*args, **kwargs):
        raise NotImplementedError(f"sgl_kernel.{name} is not available: vradix's hybrid CPU aid defines it for "
                                  "imports only (GDN/KDA models are not served on CPU)")

    op.__name__ = name
    return op


def _sgl_kernel_mamba_module() -> types.ModuleType:
    mod = types.ModuleType("sgl_kernel.mamba", "vradix hybrid CPU aid: torch causal conv1d stand-ins")
    setattr(mod, "causal_conv1d_fn_cpu", causal_conv1d_fn)
    setattr(mod, "causal_conv1d_update_cpu", causal_conv1d_update)

    def __getattr__(name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _unavailable(f"mamba.{name}")

    setattr(mod, "__getattr__", __getattr__)  # PEP 562: a module-level __getattr__
    return mod


def _define_import_time_ops() -> None:
    define_unavailable_ops(IMPORT_TIME_OPS, _unavailable)


def apply() -> None:
    """Install the hybrid aids in this process (idempotent). Raises RuntimeError on a machine with CUDA."""
    global _applied
    if _applied:
        return
    if torch.cuda.is_available():
        raise RuntimeError("vradix CPU aids are for CPU-only test machines; refusing to patch Mamba ops on a CUDA host")
    sys.modules.setdefault("sgl_kernel.mamba", _sgl_kernel_mamba_module())
    _define_import_time_ops()
    from sglang.srt.layers.attention.mamba import mamba

    # SGLang picks the `_triton` names instead when the KV layout is page-major; both get the same stand-ins
    mamba.causal_conv1d_fn = mamba.causal_conv1d_fn_triton = causal_conv1d_fn
    mamba.causal_conv1d_update = mamba.causal_conv1d_update_triton = causal_conv1d_update
    mamba.mamba_chunk_scan_combined = mamba_chunk_scan_combined
    mamba.selective_state_update = selective_state_update
    _applied = True


def register() -> None:
    """`sglang.srt.plugins` entry point of the `vradix_hybrid_cpu_aids` test plugin."""
    apply()
