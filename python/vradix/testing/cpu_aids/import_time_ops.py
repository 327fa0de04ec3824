"""`torch.ops.sgl_kernel` ops that SGLang's model modules look up at import time, which the CPU engine never calls
for the tiny test models. The CPU aids define each missing one with a body that raises, so the imports succeed and
a call fails loudly."""
from __future__ import annotations

import torch

_library = None  # one FRAGMENT of the sgl_kernel namespace for every aid


def define_unavailable_ops(names, unavailable) -> None:
    """Define each op of `names` missing from `torch.ops.sgl_kernel` (idempotent), with `unavailable(name)` as its
    body."""
    global _library
    missing = [name for name in names if not hasattr(torch.ops.sgl_kernel, name)]
    if not missing:
        return
    _library = _library or torch.library.Library("sgl_kernel", "FRAGMENT")
    for name in missing:
        _library.define(f"{name}(Tensor x) -> Tensor")
        _library.impl(name, unavailable(name), "CompositeExplicitAutograd")
