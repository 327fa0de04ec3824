"""sglang-vradix's build steps that pyproject.toml cannot declare (its metadata lives there): the `vradix._C` CUDA
kernels when CUDA torch and nvcc are present, and the SGLANG_PLUGINS startup check shipped next to the package.

VRADIX_BUILD_CUDA=0 skips the extension (CPU installs, CI's venv); =1 requires it (fails if it cannot be built);
unset builds it when possible. TORCH_CUDA_ARCH_LIST picks the targets (e.g. "9.0" for H100/H200).
"""
import glob
import os
import shutil

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

#: runs at interpreter start and warns when SGLANG_PLUGINS excludes the installed plugin (vradix.plugin.warn_if_excluded)
PTH = "vradix-plugin-check.pth"


class build_py_with_pth(build_py):
    """Ship the startup check at the top of site-packages, next to the package (where .pth files are read)."""

    def run(self):
        super().run()
        self.copy_file(os.path.join("python", PTH), os.path.join(self.build_lib, PTH))


def cuda_extension():
    """(ext_modules, cmdclass) for csrc/, or ([], {}) when it should not or cannot be built."""
    want = os.environ.get("VRADIX_BUILD_CUDA", "auto").strip().lower()
    if want in ("0", "false", "no", "off"):
        return [], {}
    try:
        import torch
        from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CUDAExtension
    except ImportError:
        torch = None
    nvcc = CUDA_HOME and os.path.exists(os.path.join(CUDA_HOME, "bin", "nvcc")) if torch else shutil.which("nvcc")
    if torch is None or torch.version.cuda is None or not nvcc:
        if want in ("1", "true", "yes", "on"):
            raise RuntimeError("VRADIX_BUILD_CUDA=1 but CUDA torch and nvcc (CUDA_HOME) are not both available")
        return [], {}
    include_dirs = [os.path.abspath("csrc")]
    # pip's CUDA torch ships some CUDA headers (cusparse, cublas, ...) only in its nvidia/* wheels.
    include_dirs += glob.glob(os.path.join(os.path.dirname(os.path.dirname(torch.__file__)), "nvidia", "*", "include"))
    ext = CUDAExtension(
        name="vradix._C",
        sources=["csrc/bindings.cpp", "csrc/vradix_kernels.cu"],
        depends=glob.glob("csrc/*.h"),  # rebuilds on a header change; setuptools also ships them in the sdist
        include_dirs=include_dirs,
        extra_compile_args={"cxx": ["-O3"], "nvcc": ["-O3", "--use_fast_math"]},
    )
    return [ext], {"build_ext": BuildExtension.with_options(use_ninja=bool(shutil.which("ninja")))}


ext_modules, cmdclass = cuda_extension()
cmdclass = {**cmdclass, "build_py": build_py_with_pth}

setup(ext_modules=ext_modules, cmdclass=cmdclass)
