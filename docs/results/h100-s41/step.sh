# step.sh: sourced by run-a.sh and run-b.sh.
# step NAME SECONDS CMD...: runs CMD under a timeout, its output to
# $OUT/NAME.log, and appends "NAME rc=… … s" to $OUT/steps.txt.
step() {
  local name=$1 secs=$2; shift 2
  local t0=$SECONDS
  timeout "$secs" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc $((SECONDS - t0)) s" | tee -a "$OUT/steps.txt"
}
