"""Builds the Python package with its C++ extension, the way PyTorch
extensions are built:

    cargo build --release -p torch-alloc            # the pool (Rust)
    pip install --no-build-isolation ./python       # this package

The pool's library is copied into the package when it has been built, so
an installed `gpumalloc_torch.enable()` finds it without
$GPUMALLOC_TORCH_LIB.
"""

import shutil
from pathlib import Path

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CUDAExtension

here = Path(__file__).resolve().parent
lib = here.parent / "target" / "release" / "libgpumalloc_torch.so"
package_data = []
if lib.exists():
    shutil.copy2(lib, here / "gpumalloc_torch" / lib.name)
    package_data.append(lib.name)

setup(
    name="gpumalloc_torch",
    version="0.1.0",
    description="gpumalloc's CUDA virtual-memory pool as PyTorch's CUDA allocator",
    packages=["gpumalloc_torch"],
    package_data={"gpumalloc_torch": package_data},
    ext_modules=[
        CUDAExtension(
            "gpumalloc_torch._gpumalloc_ext",
            ["gpumalloc_torch/csrc/gpumalloc_ext.cpp"],
            libraries=["torch_cuda", "c10_cuda"],
        )
    ],
    cmdclass={"build_ext": BuildExtension},
)
