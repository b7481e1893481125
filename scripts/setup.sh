#!/usr/bin/env bash
# Installs what a fresh machine needs to build and check gpumalloc: the pinned
# Rust toolchain with the components the NVPTX build uses (automatic toolchain
# installation is off on our machines), ptxas from PyPI and pytest. Prints
# the path of ptxas on its last line.
set -euo pipefail
cd "$(dirname "$0")/.."
toolchain=$(sed -n 's/^channel = "\(.*\)"/\1/p' rust-toolchain.toml)
rustup component add --toolchain "$toolchain" rust-src llvm-tools llvm-bitcode-linker clippy rustfmt >&2
python3 -m pip install --quiet --disable-pip-version-check "nvidia-cuda-nvcc>=13,<14" pytest >&2
python3 - <<'PY'
import os, nvidia
for root in nvidia.__path__:
    for sub in ("cu13/bin/ptxas", "cuda_nvcc/bin/ptxas"):
        p = os.path.join(root, sub)
        if os.path.exists(p):
            print(p)
            raise SystemExit
raise SystemExit("ptxas not found in the nvidia-cuda-nvcc wheel")
PY
