#!/usr/bin/env bash
# CI's fuzz pass (issue 18): builds the libFuzzer targets with clang (ASan + UBSan), writes the seed
# corpora, and runs each target for a bounded number of executions (KVQ_FUZZ_RUNS per target, under
# the resource limits of scripts/fuzz_common.sh) from its seeds and saved regressions, with a fixed
# seed so a run is reproducible. Any crash, leak, hang, limit violation or broken property fails
# the script; libFuzzer writes the input as crash-*/leak-*/oom-*/timeout-* in the target's folder
# under $KVQ_FUZZ_BUILD/fuzz/ci/. Sized for < 4 minutes on 2 cores (docs/reliability.md).
set -euo pipefail
source "$(dirname "$0")/fuzz_common.sh"
declare -A runs=([gguf]=20000 [llama2c]=100000 [snapshot]=60000 [tokenizer_spm]=100000 [tokenizer_bpe]=100000
                 [parsers]=60000 [chat_template]=30000
                 [openai_request]=60000)
fuzz_configure_and_build
status=0
for t in "${fuzz_targets[@]}"; do
  work=$fuzz_build/fuzz/ci/$t
  rm -rf "$work" && mkdir -p "$work/new"
  n=${KVQ_FUZZ_RUNS:-${runs[$t]}}
  start=$SECONDS
  # shellcheck disable=SC2046
  if (cd "$work" && "$fuzz_build/fuzz/${t}_fuzzer" -runs="$n" -seed=1 "${fuzz_limits[@]}" $(fuzz_dict "$t") \
        -print_final_stats=1 new $(fuzz_inputs "$t") >log.txt 2>&1); then
    echo "fuzz $t: $n runs ok in $((SECONDS - start)) s: $(grep -a -E '^#[0-9]+.*(DONE|cov:)' "$work/log.txt" | tail -1)"
  else
    echo "fuzz $t: FAILED (log: $work/log.txt)"; tail -40 "$work/log.txt"; status=1
  fi
done
exit $status
