#!/usr/bin/env bash
# ptxas-report.sh PTXAS FILE.ptx...: assembles each PTX for sm_80 and sm_90,
# prints registers, spills and stack per kernel, and fails on an assembler
# error, on spills in any kernel, or on a `.sys`-scoped atomic or fence
# (the allocator means `.gpu` scope everywhere).
set -euo pipefail
ptxas=$1; shift
status=0
for ptx in "$@"; do
  if grep -nE '\.sys\b' "$ptx"; then
    echo "error: $ptx has .sys-scoped operations"; status=1
  fi
  for arch in sm_80 sm_90; do
    echo "-- $(basename "$ptx") for $arch"
    out=$("$ptxas" -v -arch=$arch "$ptx" -o /dev/null 2>&1) || { echo "$out"; echo "error: ptxas failed"; exit 1; }
    echo "$out" | awk '
      /Compiling entry function/ { name=$7; gsub(/\047/, "", name) }
      /Function properties for/ { if ($7 != name) name="" }
      /bytes stack frame/ && name != "" { stack=$1; spill_st=$5; spill_ld=$9 }
      /Used [0-9]+ registers/ && name != "" {
        printf "  %-28s regs %3s  stack %4s  spill stores %s loads %s\n", name, $5, stack, spill_st, spill_ld
        if (spill_st + spill_ld > 0) bad = 1
        name = ""
      }
      END { exit bad }' || { echo "error: spills in $(basename "$ptx") for $arch"; status=1; }
  done
done
exit $status
