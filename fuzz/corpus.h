// Seed corpora for the fuzz targets, written with kvq's own writers (synth's GGUF models,
// GgufWriter, the snapshot writer through KvCache::Save) plus small hand-built llama2.c files and
// texts: fuzz/make_corpus.sh writes them to disk for libFuzzer, and the regression test
// (tests/fuzz/) generates them and feeds each through its target.
#pragma once

#include <string>
#include <string_view>

#include "kvq/status.h"

namespace kvq::fuzz {

/// The fuzz targets, as named in fuzz/ (<name>_fuzzer.cc) and as the corpus's subfolders.
inline constexpr const char* kFuzzTargets[] = {"gguf",          "llama2c",       "snapshot",
                                               "tokenizer_spm", "tokenizer_bpe", "parsers",
                                               "chat_template", "openai_request"};

/// Writes dir/<target>/<seed> for every target, or only for `only` when it is not empty (folders
/// created; existing seeds overwritten). Fails naming the seed whose writer failed.
Status WriteSeedCorpus(const std::string& dir, std::string_view only = {});

}  // namespace kvq::fuzz
