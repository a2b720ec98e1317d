#!/usr/bin/env python3
"""Writes the tables of kvq's NFC normaliser (src/text/nfc.h) from the Unicode Character Database.

Run at build time by CMake (src/text's generated source), never by hand:

    python3 scripts/gen_nfc_tables.py --ucd /usr/share/unicode --out build/.../nfc_tables.cc \
        [--test-out build/.../NormalizationTest.txt]

The data is Debian's `unicode-data` package (scripts/setup.sh installs it): UnicodeData.txt
(canonical combining classes, canonical decompositions) and CompositionExclusions.txt (the
script-specific and post-composition-version exclusions). Only the Python standard library is used.

Tables (Hangul syllables are left out: nfc.cc composes and decomposes them algorithmically):
  - kCombiningClasses: (code point << 8) | ccc for every code point whose ccc is not 0, sorted.
  - kDecompositions / kDecompositionData: the full canonical decomposition of every code point
    that has one (applied recursively here, so one lookup gives the final sequence).
  - kCompositions: (first, second) -> composite for every primary composite: a canonical
    decomposition into exactly two code points whose character is not a Full_Composition_Exclusion
    (listed in CompositionExclusions.txt, or a singleton, or a non-starter decomposition).
--test-out writes NormalizationTest.txt (shipped compressed as NormalizationTest.txt.bz2) next
to the tables, for tests/text/nfc_test.cc.
"""
import argparse
import bz2
import re
import sys
from pathlib import Path

PER_LINE = 6


def read_unicode_data(path):
    ccc = {}
    decomposition = {}  # canonical only: code point -> [code points]
    for line in path.read_text(encoding="utf-8").splitlines():
        fields = line.split(";")
        if len(fields) < 6:
            continue
        cp = int(fields[0], 16)
        if int(fields[3]) != 0:
            ccc[cp] = int(fields[3])
        d = fields[5].strip()
        if d and not d.startswith("<"):
            decomposition[cp] = [int(x, 16) for x in d.split()]
    return ccc, decomposition


def read_exclusions(path):
    text = path.read_text(encoding="utf-8")
    version = re.match(r"# CompositionExclusions-(\d+\.\d+\.\d+)\.txt", text)
    if not version:
        sys.exit(f"gen_nfc_tables: {path}: no version line '# CompositionExclusions-X.Y.Z.txt'")
    excluded = set()
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        if ".." in line:
            first, last = (int(x, 16) for x in line.split(".."))
            excluded.update(range(first, last + 1))
        else:
            excluded.add(int(line, 16))
    return version.group(1), excluded


def full_decomposition(cp, decomposition):
    if cp not in decomposition:
        return [cp]
    out = []
    for part in decomposition[cp]:
        out.extend(full_decomposition(part, decomposition))
    return out


def render(version, ccc, decomposition, excluded):
    ccc_entries = [(cp << 8) | c for cp, c in sorted(ccc.items())]
    decomp_rows, data = [], []
    for cp in sorted(decomposition):
        full = full_decomposition(cp, decomposition)
        decomp_rows.append((cp, len(data), len(full)))
        data.extend(full)
    if len(data) > 0xFFFF or max(r[2] for r in decomp_rows) > 0xFF:
        sys.exit("gen_nfc_tables: the decomposition data outgrew NfcDecomposition's fields (nfc.h)")
    compositions = []
    for cp, parts in decomposition.items():
        if len(parts) != 2 or cp in excluded:
            continue
        if ccc.get(cp, 0) != 0 or ccc.get(parts[0], 0) != 0:
            continue  # a non-starter decomposition
        compositions.append((parts[0], parts[1], cp))
    compositions.sort()

    def rows(values, fmt):
        items = [fmt(v) for v in values]
        return ["    " + ", ".join(items[i:i + PER_LINE]) + "," for i in range(0, len(items), PER_LINE)]

    lines = [
        f"// Generated at build time by scripts/gen_nfc_tables.py from the Unicode {version} Character",
        "// Database (Debian's unicode-data package). Not committed; do not edit.",
        '#include "text/nfc.h"',
        "",
        "namespace kvq::unicode::detail {",
        "",
        f'const char kNfcUnicodeVersion[] = "{version}";',
        "",
        "const uint32_t kCombiningClasses[] = {",
        *rows(ccc_entries, lambda v: f"0x{v:08X}"),
        "};",
        f"const size_t kCombiningClassCount = {len(ccc_entries)};",
        "",
        "const NfcDecomposition kDecompositions[] = {",
        *rows(decomp_rows, lambda r: f"{{0x{r[0]:05X}, {r[1]}, {r[2]}}}"),
        "};",
        f"const size_t kDecompositionCount = {len(decomp_rows)};",
        "const uint32_t kDecompositionData[] = {",
        *rows(data, lambda v: f"0x{v:05X}"),
        "};",
        "",
        "const NfcComposition kCompositions[] = {",
        *rows(compositions, lambda c: f"{{0x{c[0]:05X}, 0x{c[1]:05X}, 0x{c[2]:05X}}}"),
        "};",
        f"const size_t kCompositionCount = {len(compositions)};",
        "",
        "}  // namespace kvq::unicode::detail",
        "",
    ]
    return "\n".join(lines)


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ucd", type=Path, required=True, help="the folder of UnicodeData.txt")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--test-out", type=Path)
    args = parser.parse_args()
    needed = [args.ucd / "UnicodeData.txt", args.ucd / "CompositionExclusions.txt"]
    if args.test_out:
        needed.append(args.ucd / "NormalizationTest.txt.bz2")
    for path in needed:
        if not path.exists():
            sys.exit(f"gen_nfc_tables: {path} is missing; install Debian's unicode-data package "
                     "(scripts/setup.sh)")
    ccc, decomposition = read_unicode_data(needed[0])
    version, excluded = read_exclusions(needed[1])
    write(args.out, render(version, ccc, decomposition, excluded))
    if args.test_out:
        write(args.test_out, bz2.decompress(needed[2].read_bytes()).decode("utf-8"))


if __name__ == "__main__":
    main()
