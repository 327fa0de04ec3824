"""`sgl_kernel.utils` of the GPU aid's import-only shim: SGLang's Triton attention backend asks at init whether the
GPU supports programmatic dependent launch (PDL), an sgl_kernel launch option; without sgl_kernel the answer is no.
Every other name raises when called (the shim's `__getattr__`)."""
from sgl_kernel import __getattr__  # noqa: F401  (PEP 562: unknown names are functions that raise)


def is_arch_support_pdl() -> bool:
    """No PDL launches: the kernels that would use them are not installed."""
    return False
