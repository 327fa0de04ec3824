"""`sgl_kernel.quantization` of the GPU aid's import-only shim: SGLang imports it at module level on CUDA; every name is a
function that raises when called (the shim's `__getattr__`)."""
from sgl_kernel import __getattr__  # noqa: F401  (PEP 562)
