#!/usr/bin/env bash
# Builds and runs example 03, the CUDA C++ one (examples/cpp/03_alloc_check.cu),
# on a GPU machine with nvcc and no Rust, from what scripts/stage-gpu.sh put in .gpu/
# (device_c_abi.ptx, gpu_kernels.ptx for the C API test, libgpumalloc_c.so,
# test-capi_gpu), then runs the C API's
# GPU test. The build lines are the README's ("Linking from CUDA C++"). It
# also links the example with a copy of the PTX whose layout fingerprint
# differs and checks that gm_check_device_layout refuses it.
#
#   scripts/build-cpp-example.sh [threads]      # default 2^20 threads
#
# Env: GPU_DIR (default .gpu), NVCC (default nvcc), ARCH (default: the
# GPU's compute capability from nvidia-smi, else sm_90), OUT (default
# .gpu/cpp).
set -euo pipefail
cd "$(dirname "$0")/.."

GPU_DIR=${GPU_DIR:-.gpu}
NVCC=${NVCC:-nvcc}
OUT=${OUT:-$GPU_DIR/cpp}
if [[ -z "${ARCH:-}" ]]; then
  cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .' || true)
  ARCH=sm_${cc:-90}
fi
PTX=$GPU_DIR/device_c_abi.ptx
for f in "$PTX" "$GPU_DIR/libgpumalloc_c.so"; do
  [[ -f $f ]] || { echo "missing $f: run scripts/stage-gpu.sh on the build machine and copy .gpu/ here" >&2; exit 1; }
done
mkdir -p "$OUT"
lib_dir=$(cd "$GPU_DIR" && pwd)

echo "== nvcc $($NVCC --version | tail -1), $ARCH"
set -x
"$NVCC" -arch="$ARCH" -rdc=true -I include -c examples/cpp/03_alloc_check.cu -o "$OUT/03_alloc_check.o"
"$NVCC" -arch="$ARCH" -dc "$PTX" -o "$OUT/device_c_abi.o"
"$NVCC" -arch="$ARCH" -dlink "$OUT/03_alloc_check.o" "$OUT/device_c_abi.o" -o "$OUT/03_alloc_check_dlink.o"
"$NVCC" -arch="$ARCH" "$OUT/03_alloc_check.o" "$OUT/device_c_abi.o" "$OUT/03_alloc_check_dlink.o" \
  -L "$lib_dir" -lgpumalloc_c -Xlinker -rpath -Xlinker "$lib_dir" -o "$OUT/03_alloc_check"
"$OUT/03_alloc_check" "${1:-1048576}"
{ set +x; } 2>/dev/null

# The layout check must refuse a stale device_c_abi.ptx: the same example
# linked with a copy whose fingerprint (the GPUMALLOC_LAYOUT_FINGERPRINT
# global's first byte) differs has to stop at gm_check_device_layout.
echo "== a stale device_c_abi.ptx is refused"
stale=$OUT/stale_device_c_abi.ptx
python3 - "$PTX" "$stale" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
pattern = r"(GPUMALLOC_LAYOUT_FINGERPRINT\[8\] = \{)(\d+)"
changed, n = re.subn(pattern, lambda m: m.group(1) + str(int(m.group(2)) ^ 1), text)
if n != 1:
    sys.exit("no GPUMALLOC_LAYOUT_FINGERPRINT initializer in " + sys.argv[1])
open(sys.argv[2], "w").write(changed)
PY
"$NVCC" -arch="$ARCH" -dc "$stale" -o "$OUT/stale_device_c_abi.o"
"$NVCC" -arch="$ARCH" -rdc=true "$OUT/03_alloc_check.o" "$OUT/stale_device_c_abi.o" \
  -L "$lib_dir" -lgpumalloc_c -Xlinker -rpath -Xlinker "$lib_dir" -o "$OUT/03_alloc_check_stale"
if "$OUT/03_alloc_check_stale" 1024 >"$OUT/stale.log" 2>&1; then
  cat "$OUT/stale.log"; echo "FAIL: the stale device code was not refused" >&2; exit 1
fi
cat "$OUT/stale.log"
grep -q "gm_check_device_layout: status 8" "$OUT/stale.log" \
  || { echo "FAIL: the stale run failed, but not at the layout check" >&2; exit 1; }
echo "refused, as it should be"

if [[ -x $GPU_DIR/test-capi_gpu ]]; then
  echo "== the C API's GPU test"
  GPUMALLOC_PTX=$GPU_DIR/gpu_kernels.ptx "$GPU_DIR/test-capi_gpu" --include-ignored --nocapture
fi
echo "C++ example and C API test passed"
