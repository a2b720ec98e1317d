# Sourced by scripts/fuzz_ci.sh and scripts/fuzz_campaign.sh: the fuzz build and how each target
# is run. Resource limits (docs/reliability.md, "Resource limits"): inputs are at most
# KVQ_FUZZ_MAX_LEN bytes (1 MiB); every target checks, around each input, that no single
# allocation exceeded 16 x the input's size + 1 MiB (fuzz/fuzz_util.h AllocationLimit), and
# -malloc_limit_mb=17 (that limit at the largest input) stops a bigger one at the allocation
# itself, with its stack; the process may not exceed 2048 MiB RSS (the ASan build with a grown
# in-memory corpus runs at 400-450 MiB), and one input may not run past 10 s (a hang).
fuzz_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
fuzz_build=${KVQ_FUZZ_BUILD:-$fuzz_root/build-fuzz}
fuzz_targets=(gguf llama2c snapshot tokenizer_spm tokenizer_bpe parsers chat_template openai_request)
fuzz_limits=(-max_len="${KVQ_FUZZ_MAX_LEN:-1048576}" -malloc_limit_mb=17 -rss_limit_mb=2048 -timeout=10)

# A build folder already configured with KVQ_FUZZ=ON (CI's sanitizer build, which builds the tests and
# the fuzz targets from one set of instrumented libraries) is only built; otherwise it is configured
# for the fuzz targets alone.
fuzz_configure_and_build() {
  if ! grep -qs '^KVQ_FUZZ:BOOL=ON$' "$fuzz_build/CMakeCache.txt"; then
    CC=clang CXX=clang++ CCACHE_BASEDIR=${CCACHE_BASEDIR:-$fuzz_root} cmake -S "$fuzz_root" -B "$fuzz_build" -G Ninja \
      -DKVQ_FUZZ=ON -DKVQ_SANITIZE=ON -DKVQ_BUILD_TESTS=OFF -DKVQ_BUILD_BENCH=OFF \
      -DCMAKE_BUILD_TYPE=None "-DCMAKE_CXX_FLAGS=-O1 -g1" >/dev/null
  fi
  cmake --build "$fuzz_build" --target kvq_fuzzers -j"${KVQ_FUZZ_JOBS:-2}"
  "$fuzz_root/fuzz/make_corpus.sh" "$fuzz_build" "$fuzz_build/fuzz/corpus"
}

# fuzz_dict TARGET: the -dict flag for TARGET, if it has one.
fuzz_dict() {
  case $1 in
    gguf) echo "-dict=$fuzz_root/fuzz/gguf.dict" ;;
    snapshot) echo "-dict=$fuzz_root/fuzz/snapshot.dict" ;;
    parsers) echo "-dict=$fuzz_root/fuzz/parsers.dict" ;;
    chat_template) echo "-dict=$fuzz_root/fuzz/chat_template.dict" ;;
    openai_request) echo "-dict=$fuzz_root/fuzz/openai_request.dict" ;;
  esac
}

# fuzz_inputs TARGET: the read-only corpus folders (seeds, saved regressions).
fuzz_inputs() {
  echo "$fuzz_build/fuzz/corpus/$1"
  if [[ -d $fuzz_root/fuzz/regressions/$1 ]]; then echo "$fuzz_root/fuzz/regressions/$1"; fi
}
