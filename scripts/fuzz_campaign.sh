#!/usr/bin/env bash
# The long fuzz campaign (issue 18): every target for KVQ_FUZZ_RUNS executions (default 10^6) under
# the same limits as CI (scripts/fuzz_common.sh), growing a persistent corpus in
# $KVQ_FUZZ_BUILD/fuzz/campaign/<target>/corpus; per target a log and libFuzzer's final stats.
# docs/reliability.md records a run. Usage: scripts/fuzz_campaign.sh [TARGET...] (default: all).
# KVQ_FUZZ_PARALLEL targets run at once (default 1); KVQ_FUZZ_MAX_SECONDS caps each target's time
# (libFuzzer's -max_total_time; default: no cap).
set -euo pipefail
source "$(dirname "$0")/fuzz_common.sh"
runs=${KVQ_FUZZ_RUNS:-1000000}
targets=("$@")
[[ ${#targets[@]} -gt 0 ]] || targets=("${fuzz_targets[@]}")
[[ ${KVQ_FUZZ_SKIP_BUILD:-0} == 1 ]] || fuzz_configure_and_build
run_one() {
  local t=$1 work=$fuzz_build/fuzz/campaign/$1
  mkdir -p "$work/corpus"
  local start=$SECONDS
  # shellcheck disable=SC2046
  local cap=()
  [[ -z ${KVQ_FUZZ_MAX_SECONDS:-} ]] || cap=(-max_total_time="$KVQ_FUZZ_MAX_SECONDS")
  (cd "$work" && "$fuzz_build/fuzz/${t}_fuzzer" -runs="$runs" "${cap[@]}" "${fuzz_limits[@]}" $(fuzz_dict "$t") \
      -print_final_stats=1 corpus $(fuzz_inputs "$t") >log.txt 2>&1)
  local rc=$?
  # libFuzzer's final stats line (stat::number_of_executed_units) is the executions count.
  echo "$t rc=$rc seconds=$((SECONDS - start)) $(grep -a -E '^#[0-9]+' "$work/log.txt" | tail -1)" | tee "$work/summary.txt"
}
pids=()
for t in "${targets[@]}"; do
  run_one "$t" &
  pids+=($!)
  while [[ $(jobs -rp | wc -l) -ge ${KVQ_FUZZ_PARALLEL:-1} ]]; do wait -n || true; done
done
wait
