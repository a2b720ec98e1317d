// Fuzz target: llama2.c files. The input is [u32 n, little-endian][n bytes: a checkpoint][the rest:
// a tokenizer file] (n past the end: all of it is the checkpoint, no tokenizer). The checkpoint goes
// through LoadLlama2c, the tokenizer through Tokenizer::LoadLlama2c for the checkpoint's vocabulary
// size (its header's field when the checkpoint is refused: the tokenizer is fuzzed either way); a
// tokenizer that loads with all 256 byte pieces and a space piece must round-trip text:
// Detokenize(Encode(s)) == s.
#include <cstdint>
#include <algorithm>
#include <climits>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "model/llama2c.h"
#include "text/tokenizer.h"

namespace kvq::fuzz {

int FuzzLlama2c(const uint8_t* data, size_t size) {
  uint32_t n = 0;
  if (size >= 4) std::memcpy(&n, data, 4);
  const uint8_t* body = data + std::min<size_t>(size, 4);
  const size_t body_size = size - std::min<size_t>(size, 4);
  const size_t checkpoint_size = std::min<size_t>(n, body_size);
  const std::string checkpoint = WriteInput(body, checkpoint_size, "checkpoint.bin");
  Result<DecoderWeights> weights = LoadLlama2c(checkpoint);
  if (checkpoint_size == body_size) return 0;

  int32_t vocab_size = 0;
  if (weights.ok()) {
    vocab_size = weights->config.vocab_size;
  } else if (checkpoint_size >= 24) {
    std::memcpy(&vocab_size, body + 20, 4);  // header field 6 (negative: a separate classifier)
    vocab_size = vocab_size == INT32_MIN ? 0 : (vocab_size < 0 ? -vocab_size : vocab_size);
  }
  const std::string tokenizer_path = WriteInput(body + checkpoint_size, body_size - checkpoint_size, "tok.bin");
  Result<Tokenizer> loaded = Tokenizer::LoadLlama2c(tokenizer_path, vocab_size);
  if (!loaded.ok()) return 0;
  Tokenizer tokenizer = std::move(loaded).value();
  if (tokenizer.vocab_size() != vocab_size) Fail("llama2c", "the tokenizer loaded another vocabulary size");
  tokenizer.set_notice_sink([](std::string_view) {});
  const std::string_view text = "Once upon a time, \xe2\x96\x81 1+1=2\n\xff\xc3(";
  const std::vector<int32_t> ids = tokenizer.Encode(text, /*add_bos=*/true);
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size) Fail("llama2c", "Encode returned id " + std::to_string(id));
  }
  // Text holding a control or unknown token's text (a fuzzed vocabulary's may be anything) has
  // that token cut out (Tokenizer::literal_tokens()) and does not come back. Otherwise, with every
  // byte piece and a piece for the space Encode puts in front the text comes back. Without that
  // piece the space becomes the byte piece <0x20>, which Decode keeps after BOS by design
  // (tests/text/tokenizer_spm_test.cc, ByteFallbackAndInvalidUtf8), so the text comes back with a
  // space in front (fuzz/regressions/llama2c/space-prefix-byte-piece.bin; docs/reliability.md).
  bool space_piece = false;
  for (int32_t id = 0; id < tokenizer.vocab_size() && !space_piece; ++id) {
    space_piece = tokenizer.type(id) == Tokenizer::TokenType::kNormal && tokenizer.piece(id) == " ";
  }
  const bool literal = std::any_of(
      tokenizer.literal_tokens().begin(), tokenizer.literal_tokens().end(),
      [&](int32_t id) { return text.find(tokenizer.piece(id)) != std::string_view::npos; });
  if (!literal && tokenizer.has_byte_pieces() && space_piece && tokenizer.Detokenize(ids) != text) {
    Fail("llama2c", "Detokenize(Encode(s)) != s with all byte pieces present");
  }
  return 0;
}

}  // namespace kvq::fuzz

KVQ_FUZZ_TARGET(FuzzLlama2c)
