#!/usr/bin/env bash
# Builds everything the GPU machine needs (it has CUDA but no Rust) and copies
# it into .gpu/: the gpumalloc program, the GPU test binaries, the examples,
# the PTX, and the C API (libgpumalloc_c.so, with include/gpumalloc.h from the
# repository) that scripts/build-cpp-example.sh links the CUDA C++ example
# against. Then run scripts/gpu-suite.sh there with GPUMALLOC_BIN=.gpu.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .gpu
cargo build --release --bins --examples
cargo build --release -p torch-alloc -p capi
cp target/release/gpumalloc target/release/libgpumalloc_torch.so target/release/libgpumalloc_c.so .gpu/
# The numbered Rust examples (03 is CUDA C++: scripts/build-cpp-example.sh).
for example in 01_first_alloc 02_linked_list 04_growing_heap; do
  cp "target/release/examples/$example" .gpu/
done
# The lake against the caching pool (issue 13): .gpu/lake-periodic --cuda.
cargo build --release -p lake --example periodic
cp target/release/examples/periodic .gpu/lake-periodic
for spec in gpumalloc:gpu gpumalloc:gpu_heap_whole gpumalloc:gpu_vmm_heap gpumalloc:gpu_vmm_peers gpumalloc:graph_gpu lake:lake_gpu torch-alloc:call_cost capi:capi_gpu; do
  pkg=${spec%%:*}; t=${spec#*:}
  bin=$(cargo test --release -p "$pkg" --no-run --test "$t" --message-format=json 2>/dev/null \
        | T="$t" python3 -c 'import json,os,sys
# The test binary itself: cargo also lists the package binaries the
# test depends on, in no fixed order.
for l in sys.stdin:
    m=json.loads(l)
    if (m.get("reason")=="compiler-artifact" and m.get("executable")
            and m["target"]["kind"]==["test"] and m["target"]["name"]==os.environ["T"]):
        print(m["executable"])' | tail -1)
  if [ -z "$bin" ]; then echo "no test binary for $spec" >&2; exit 1; fi
  cp "$bin" ".gpu/test-$t"
done
# The PTX this build embedded, by the paths its build scripts reported
# (GPUMALLOC_*_PTX_PATH). target/release/build keeps one folder per set of
# build settings, and the folders of other builds (other GPUMALLOC_*
# settings, older sources) hold PTX with other heap layouts: a C++ program
# linked against one of those reads a heap its host library laid out
# differently (example 03 failed that way on 2026-11-23).
rm -f .gpu/*.ptx
cargo build --release -p gpumalloc -p host --message-format=json 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "build-script-executed":
        for key, value in m.get("env", []):
            if key.startswith("GPUMALLOC_") and key.endswith("_PTX_PATH"):
                print(value)' | while read -r ptx; do cp "$ptx" .gpu/; done
for name in gpu_kernels device_c_abi user_kernel heap_kernels; do
  [ -f ".gpu/$name.ptx" ] || { echo "no $name.ptx from the build" >&2; exit 1; }
done
ls -la .gpu
