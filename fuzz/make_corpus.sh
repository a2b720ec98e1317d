#!/usr/bin/env bash
# Writes the fuzz targets' seed corpora with kvq's own writers (fuzz/corpus.cc, built as
# kvq_fuzz_corpus by the fuzz build): OUT/<target>/ for gguf, llama2c, snapshot, tokenizer_spm,
# tokenizer_bpe, parsers, chat_template, openai_request. Generated, never committed (only fuzz/regressions/ is).
# Usage: fuzz/make_corpus.sh [BUILD_DIR (build-fuzz)] [OUT (BUILD_DIR/fuzz/corpus)]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build-fuzz}
out=${2:-$build/fuzz/corpus}
tool=$build/fuzz/kvq_fuzz_corpus
if [[ ! -x $tool ]]; then
  echo "make_corpus.sh: $tool is missing: build the fuzz targets first (scripts/fuzz_ci.sh builds them)" >&2
  exit 1
fi
rm -rf "$out"
mkdir -p "$out"
# ASan's leak check covers the writers too; the synth threads are joined before exit.
"$tool" "$out"
for d in "$out"/*/; do
  printf '%-14s %4d seeds, %8d bytes\n' "$(basename "$d")" "$(ls "$d" | wc -l)" "$(cat "$d"/* | wc -c)"
done
