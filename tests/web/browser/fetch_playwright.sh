#!/usr/bin/env bash
# Fetches npm's playwright-core (the browser driver only: it never downloads a browser; the test
# runs the system's /usr/bin/chromium) into DIR (a build folder), never into the source tree.
# A CTest fixture: if npm cannot fetch it the browser test fails, it is not skipped.
# Usage: fetch_playwright.sh DIR
set -euo pipefail
dir=${1:?usage: fetch_playwright.sh DIR}
version=1.65.1
json="$dir/node_modules/playwright-core/package.json"

installed() {
  [ -f "$json" ] && [ "$(node -p "require('$json').version")" = "$version" ]
}

if installed; then
  echo "fetch_playwright: playwright-core@$version already in $dir"
  exit 0
fi
command -v npm >/dev/null || { echo "fetch_playwright: npm is not installed (scripts/setup.sh)" >&2; exit 1; }
mkdir -p "$dir"
# PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD: playwright-core has no install hook today; this keeps it so.
PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm install --prefix "$dir" --no-audit --no-fund --no-save \
  --no-package-lock --loglevel=error "playwright-core@$version"
installed || { echo "fetch_playwright: npm ran but playwright-core@$version is not in $dir" >&2; exit 1; }
echo "fetch_playwright: installed playwright-core@$version into $dir"
