#!/usr/bin/env bash
# CI's fuzz pass (issue 18): builds the libFuzzer targets with clang (ASan + UBSan) unless
# $KVQ_FUZZ_BUILD is already a KVQ_FUZZ build (CI's sanitizer build is), writes the seed corpora,
# and runs each target for a bounded number of executions (KVQ_FUZZ_RUNS per target, under the
# resource limits of scripts/fuzz_common.sh) from its seeds and saved regressions, with a fixed
# seed so a run is reproducible; KVQ_FUZZ_PARALLEL targets at once (default 2). Any crash, leak,
# hang, limit violation or broken property fails the script; libFuzzer writes the input as
# crash-*/leak-*/oom-*/timeout-* in the target's folder under $KVQ_FUZZ_BUILD/fuzz/ci/. Sized for
# about 2 minutes on 2 cores (docs/reliability.md).
set -euo pipefail
source "$(dirname "$0")/fuzz_common.sh"
declare -A runs=([gguf]=10000 [llama2c]=100000 [snapshot]=40000 [tokenizer_spm]=50000 [tokenizer_bpe]=50000
                 [parsers]=60000 [chat_template]=30000 [openai_request]=60000)
fuzz_configure_and_build
run_target() {
  local t=$1 work=$fuzz_build/fuzz/ci/$1
  rm -rf "$work" && mkdir -p "$work/new"
  local n=${KVQ_FUZZ_RUNS:-${runs[$t]}} start=$SECONDS
  # shellcheck disable=SC2046
  if (cd "$work" && "$fuzz_build/fuzz/${t}_fuzzer" -runs="$n" -seed=1 "${fuzz_limits[@]}" $(fuzz_dict "$t") \
        -print_final_stats=1 new $(fuzz_inputs "$t") >log.txt 2>&1); then
    echo "fuzz $t: $n runs ok in $((SECONDS - start)) s: $(grep -a -E '^#[0-9]+.*(DONE|cov:)' "$work/log.txt" | tail -1)"
  else
    echo "fuzz $t: FAILED (log: $work/log.txt)"; tail -40 "$work/log.txt"; return 1
  fi
}
# Two at a time; each target's verdict is kept in its folder (a reaped job's status is not).
for t in "${fuzz_targets[@]}"; do
  while [[ $(jobs -rp | wc -l) -ge ${KVQ_FUZZ_PARALLEL:-2} ]]; do wait -n || true; done
  (if run_target "$t"; then echo ok; else echo failed; fi) > "$fuzz_build/fuzz/ci-$t.verdict" &
done
wait
status=0
for t in "${fuzz_targets[@]}"; do
  # The verdict file's last line is the verdict; the lines before it are what run_target printed.
  sed '$d' "$fuzz_build/fuzz/ci-$t.verdict"
  [[ $(tail -1 "$fuzz_build/fuzz/ci-$t.verdict") == ok ]] || status=1
done
exit $status
