#!/usr/bin/env bash
# iclock-frag.sh VARIANT...: `bench frag --iters 3` once per staged build in
# .gpu-var/VARIANT (install-clock builds print installs and waits per
# round), then each size's last round (scripts/install-clock-rounds.py).
# Run from the repository root on the GPU machine; logs and the summary go
# to $OUT (default results/iclock-frag). Each build's run is under a
# timeout of 120 s.
set -uo pipefail
cd "$(dirname "$0")/../../.."
OUT=${OUT:-results/iclock-frag}
mkdir -p "$OUT"
logs=()
for v in "$@"; do
  bin=.gpu-var/$v/gpumalloc
  [ -x "$bin" ] || { echo "no build $bin" >&2; continue; }
  log=$OUT/frag-$v.log
  timeout 120 "$bin" bench frag --iters 3 --allocators ours > "$log" 2>&1 || echo "frag $v: rc $?" >&2
  logs+=("$log")
done
python3 scripts/install-clock-rounds.py "${logs[@]}" | tee "$OUT/last-round.txt"
