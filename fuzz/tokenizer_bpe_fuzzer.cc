// Fuzz target: byte-level BPE encoding of arbitrary bytes. Byte 0 picks the vocabulary (llama.cpp's
// gpt-2, falcon and starcoder test vocabularies: three pre-tokenizers) and whether BOS is added;
// the rest is the text. Property: every id is in the vocabulary and, for text holding no control or
// user-defined token's text and no byte the vocabulary lacks (Falcon lacks 28, StarCoder 14: Encode
// drops them, as llama.cpp does), Detokenize(Encode(s)) == s byte for byte, invalid UTF-8 included.
#include <cstdint>
#include <string_view>

#include "fuzz/tokenizer_vocabs.h"

namespace kvq::fuzz {

int FuzzTokenizerBpe(const uint8_t* data, size_t size) {
  static const FuzzVocab vocabs[] = {
      LoadFuzzVocab("tests/testdata/vocab/ggml-vocab-gpt-2.gguf"),
      LoadFuzzVocab("tests/testdata/vocab/ggml-vocab-falcon.gguf"),
      LoadFuzzVocab("tests/testdata/vocab/ggml-vocab-starcoder.gguf"),
  };
  if (size == 0) return 0;
  const FuzzVocab& v = vocabs[data[0] % 3];
  if (v.tokenizer.kind() != Tokenizer::Kind::kBytePairs) Fail("tokenizer_bpe", "not a byte-level BPE vocabulary");
  CheckEncode("tokenizer_bpe", v, std::string_view(reinterpret_cast<const char*>(data + 1), size - 1),
              (data[0] & 0x80) != 0);
  return 0;
}

}  // namespace kvq::fuzz

KVQ_FUZZ_TARGET(FuzzTokenizerBpe)
