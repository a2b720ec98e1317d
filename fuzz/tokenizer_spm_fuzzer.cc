// Fuzz target: SentencePiece encoding of arbitrary bytes. Byte 0 picks the vocabulary (the bundled
// stories260K tok512.bin, llama.cpp's llama-spm and phi-3 test vocabularies) and whether BOS is
// added; the rest is the text. Property: every id is in the vocabulary and, for text holding no
// user-defined piece (phi-3 has some), Detokenize(Encode(s)) == s byte for byte — Encode promises
// that for every input, invalid UTF-8 and a literal U+2581 included.
#include <cstdint>
#include <string_view>

#include "fuzz/tokenizer_vocabs.h"

namespace kvq::fuzz {

int FuzzTokenizerSpm(const uint8_t* data, size_t size) {
  static const FuzzVocab vocabs[] = {
      LoadFuzzVocab("models/stories260K/tok512.bin", 512),
      LoadFuzzVocab("tests/testdata/vocab/ggml-vocab-llama-spm.gguf"),
      LoadFuzzVocab("tests/testdata/vocab/ggml-vocab-phi-3.gguf"),
  };
  if (size == 0) return 0;
  const FuzzVocab& v = vocabs[data[0] % 3];
  if (v.tokenizer.kind() != Tokenizer::Kind::kSentencePiece) Fail("tokenizer_spm", "not a SentencePiece vocabulary");
  CheckEncode("tokenizer_spm", v, std::string_view(reinterpret_cast<const char*>(data + 1), size - 1),
              (data[0] & 0x80) != 0);
  return 0;
}

}  // namespace kvq::fuzz

KVQ_FUZZ_TARGET(FuzzTokenizerSpm)
