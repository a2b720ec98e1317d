#!/usr/bin/env bash
# Fetches OpenAI's JavaScript client (the npm package `openai`) into DIR (the build folder's
# npm-openai/), never into the source tree, for tests/server/openai_client_test.mjs. A CTest
# fixture: if npm cannot fetch it the test that needs it fails, it is not skipped.
# 4.x: the newest major versions need Node.js 22; Debian bookworm's machines here run 20.
set -euo pipefail
dir=${1:?usage: fetch_openai.sh DIR}
version=4.95.0
json="$dir/node_modules/openai/package.json"
if [ -f "$json" ] && [ "$(node -p "require('$json').version")" = "$version" ]; then
  echo "fetch_openai: openai@$version already in $dir"
  exit 0
fi
command -v npm >/dev/null || { echo "fetch_openai: npm is not installed (scripts/setup.sh)" >&2; exit 1; }
mkdir -p "$dir"
npm install --prefix "$dir" --no-audit --no-fund --no-save --no-package-lock --loglevel=error "openai@$version"
[ -f "$json" ] || { echo "fetch_openai: npm ran but openai is not in $dir" >&2; exit 1; }
echo "fetch_openai: installed openai@$version into $dir"
