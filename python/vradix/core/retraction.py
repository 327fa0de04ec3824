"""P/D decode retraction with a KV backup: a retracted request that keeps its KV off the device.

Under pool pressure a P/D decode role's `release_req` copies a request's KV off the device (`backup_kv_cache`:
`cpu_tensor` by default with the decode radix cache, else `host_pool`), releases its row and tree lock, and queues it
in `DecodePreallocQueue.retracted_queue`; `resume_retracted_reqs` later gives it a new row and copies the backup back
into it (`restore_kv_cache`), without a re-match. Between the two the request holds no row and no lock, yet its KV
still exists and is still its own: the positions `[0, seqlen - 1)` it had computed (or matched) under its epoch.

Invariants (kept by `vradix.engine` and `vradix.request`, which reads what a
request holds: `holds_backup`, `retracted_with_backup`, `backed_up_len`):
- a request holding a backup is never re-bound (its KV was computed under its bound epoch);
- a publication while it holds a backup makes it a *crossing* request (it keeps its KV to finish and never inserts
  it), and a retraction of a crossing request that keeps a backup leaves it crossing;
- its provenance keeps the backed-up positions under the epochs that computed them (`backed_up_len`);
- a publication never resets the tree while any request holds a backup (`holds_backup`, host-staged destinations
  included): a `host_pool` backup lives in the HiCache host pool, which the reset clears.
A retraction without a backup (non-P/D engines, or a P/D request SGLang re-bootstraps) gives its KV back: the request
is re-bound and recomputes it under the current weights.

SGLang also uses the field for a decode request staged to host memory (`_pre_alloc_host`: the host destination
prefill writes into). That is not yet the request's KV, and the weight-identity handshake checks what prefill writes
there, so such a request is not `retracted_with_backup` (it is not `is_retracted`) and is re-bound like any request
that holds nothing.
"""
from __future__ import annotations

import torch


def kept_positions(req_to_token, req) -> "torch.Tensor":
    """The KV slots a backup copies and a restore writes back: `[0, seqlen - 1)` of the request's row (both
    `Req.offload_kv_cache` and `UnifiedRadixCache._retraction_device_transfers` take that range)."""
    return req_to_token[req.kv.req_pool_idx, : req.seqlen - 1]


def epochs_at_backup(ledger, req_to_token, req) -> "torch.Tensor":
    """The ledger epoch of each backed-up position, taken before the backup releases the row (its pages are then
    freed and re-stamped FREE)."""
    slots = kept_positions(req_to_token, req).to(torch.int64)
    return ledger.page_epoch[slots // ledger.page_size].clone()


def stamp_restored(ledger, req_to_token, req, epochs: "torch.Tensor") -> None:
    """A restore writes the backup into new device pages without a forward: each takes the epoch its position
    carried at the backup (the request's own KV, so a crossing request keeps the epochs that computed it)."""
    slots = kept_positions(req_to_token, req)
    n = min(int(slots.numel()), int(epochs.numel()))
    slots, epochs = slots[:n], epochs[:n].to(slots.device)
    for epoch in torch.unique(epochs).tolist():
        ledger.stamp_written(slots[epochs == epoch], int(epoch))
