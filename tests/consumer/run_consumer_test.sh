#!/usr/bin/env bash
# The installed-package test: install the build tree into a temporary prefix (bin/kvq runs from
# there), build the consumer project (C++ and C, the C program also against libkvq.so) against it,
# run them on the bundled model and compare their output with `kvq run`'s, byte for byte.
# Usage: run_consumer_test.sh BUILD_DIR SOURCE_DIR KVQ_BINARY [FLAGS]
# (FLAGS: extra compile and link flags, e.g. the sanitizer flags the build was made with).
set -euo pipefail
build=$1 src=$2 kvq=$3 flags=${4:-}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" > "$tmp/install.log"
# The program is installed too, and runs from there.
"$tmp/prefix/bin/kvq" --help > "$tmp/help.txt" || { echo "FAIL: the installed bin/kvq does not run"; exit 1; }
echo "ok: the installed bin/kvq runs ($(head -c 40 "$tmp/help.txt")...)"
cmake -S "$src/tests/consumer" -B "$tmp/build" -G Ninja -DCMAKE_PREFIX_PATH="$tmp/prefix" \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" \
  -DCMAKE_EXE_LINKER_FLAGS="$flags" > "$tmp/configure.log" || { cat "$tmp/configure.log"; exit 1; }
cmake --build "$tmp/build" > "$tmp/build.log" || { cat "$tmp/build.log"; exit 1; }
model="$src/models/stories260K/stories260K.bin"
tok="$src/models/stories260K/tok512.bin"
programs="consumer_cpp consumer_c"
if [ -f "$tmp/prefix/lib/libkvq.so" ]; then
  programs="$programs consumer_c_shared"
else
  echo "note: no libkvq.so in the install (built with KVQ_BUILD_SHARED=OFF): consumer_c_shared not built"
fi
status=0
for kv in f32 f16 int4-kivi; do
  for prompt in "Once upon a time" "Lily and Ben"; do
    "$kvq" run -m "$model" --tokenizer "$tok" -p "$prompt" -n 80 --temp 0 --kv "$kv" -t 1 > "$tmp/want.txt" 2>/dev/null
    for program in $programs; do
      "$tmp/build/$program" "$model" "$tok" "$prompt" 80 "$kv" > "$tmp/got.txt"
      if cmp -s "$tmp/want.txt" "$tmp/got.txt"; then
        echo "ok: $program --kv $kv \"$prompt\" equals kvq run ($(wc -c < "$tmp/got.txt") bytes)"
      else
        echo "FAIL: $program --kv $kv \"$prompt\" differs from kvq run:"; diff "$tmp/want.txt" "$tmp/got.txt" || true
        status=1
      fi
    done
  done
done
exit $status
