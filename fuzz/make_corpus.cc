// kvq_fuzz_corpus DIR: writes the fuzz targets' seed corpora (corpus.h) under DIR.
#include <cstdio>

#include "fuzz/corpus.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR (writes DIR/<target>/ seed corpora)\n", argv[0]);
    return 2;
  }
  const kvq::Status s = kvq::fuzz::WriteSeedCorpus(argv[1]);
  if (!s.ok()) {
    std::fprintf(stderr, "kvq_fuzz_corpus: %s\n", s.message().c_str());
    return 1;
  }
  return 0;
}
