"""Prefill/decode (P/D) disaggregation: the rules vradix enforces on each role, one module per step.

- `bootstrap`: a decode request must carry the bootstrap fields that name its prefill peer (bad input, refused where
  the request enters);
- `layout`: the role-local L3 namespace, derived from the role, its KV layout and the `weight_id`;
- `restore_policy`: which HiCache storage prefetch policy a role's L3 restore needs (decode keeps its promises only
  with `wait_complete`);
- `revocation`: which of decode's prefix promises a publication on decode revokes (those prefill has not fulfilled),
  and the 503 a revoked request fails with.
Each module is pure (no SGLang state); the hooks that apply them are in `vradix.hooks.pd`.
"""
