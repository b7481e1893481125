#!/usr/bin/env bash
# Records one training step of each of issue 16's models (GPT-2, BERT-Large,
# ResNet-50, Swin-T; random weights, fp32) as a rematerialization trace, on a
# machine with an NVIDIA GPU and PyTorch (transformers, timm; torchvision if
# present). Needs no cargo and no network. docs/remat.md says how to replay
# the traces.
#   scripts/remat-record.sh [OUT_DIR]      # default docs/results/remat
# Environment: MODELS (default "gpt2 bert resnet50 swin_t"), TIMEOUT seconds
# per model (130, so that four fit in 10 minutes), PYTHON (python3), ARGS
# (more options for record.py, e.g. "--batch 4").
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-docs/results/remat}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1
  "$PY" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__,
            "cuda", torch.cuda.is_available())' 2>&1
  for pkg in transformers timm torchvision; do
    "$PY" -c "import $pkg; print('$pkg', $pkg.__version__)" 2>&1 | tail -1
  done; } > "$OUT/env.txt"
cat "$OUT/env.txt"
status=0
for m in ${MODELS:-gpt2 bert resnet50 swin_t}; do
  echo "== $m"
  start=$(date +%s)
  # shellcheck disable=SC2086 # ARGS is a list of options
  timeout --kill-after=10 "${TIMEOUT:-130}" "$PY" python/remat/record.py --model "$m" \
    --out "$OUT/$m.remat.gz" ${ARGS:-} > "$OUT/$m.log" 2>&1
  rc=$?
  tail -n 3 "$OUT/$m.log"
  echo "   ($(( $(date +%s) - start )) s)"
  if [ $rc -ne 0 ]; then echo "FAILED ($rc): $m"; status=1; fi
done
ls -la "$OUT"
exit $status
