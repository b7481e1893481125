#!/usr/bin/env bash
# The main job (README.md): set up, build, and run every benchmark test. With
# no GPU it runs our allocator on the CPU and says so. Extra arguments go to
# `gpumalloc bench all` (e.g. --iters 3, --out DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh > /dev/null
cargo run --release -- bench all "$@"
