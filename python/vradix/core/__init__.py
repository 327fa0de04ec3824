"""The versioned radix cache, one module per step of the data path, on SGLang's real tree cache API.

1. `admission`: bind every request to the engine's current epoch (its namespace in `extra_key`);
2. `epochs`: one bump per publication; the crossing requests' KV is released, never shared;
3. `reclaim`, `deferred_reclaim`, `host_tier`: free stale KV lock-aware (device now or later, host copies at the bump);
then the paths that hand a request KV or state besides the tree match: `sessions`, `retraction`, `dedup`, `overlap`,
`lora`, `mm_embeddings`/`weight_derived`; `published`, what was published into the model (the layout-invariant weight
identity); and `provenance`. `state` holds the records of the engine's parts (`vradix.engine.Engine` holds the parts).
Imports only the root vocabulary, `kernels` and `ledger`."""
