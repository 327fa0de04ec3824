"""Import-only `sgl_kernel` shim for CPU serving and tests (NOT a kernel library).

SGLang 0.5.23 imports a few `sgl_kernel` CPU ops at module load when `SGLANG_USE_CPU_ENGINE=1`; the torch_native CPU
path never calls them. Every attribute is a function that raises, so an accidental call fails loudly.
"""
__version__ = "0.0.0+vradix-shim"


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)

    def _unavailable(*args, **kwargs):
        raise NotImplementedError(f"sgl_kernel.{name} is not available: this is vradix's import-only CPU shim")

    _unavailable.__name__ = name
    return _unavailable
