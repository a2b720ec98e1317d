// The tokenizer calls the public Model and Vocabulary (include/kvq/model.h, vocabulary.h) both
// answer, written once (api/vocabulary.cc) over the tokenizer each holds. `vocab_size` bounds the
// ids a call accepts: ModelInfo::vocab_size for a Model, the tokenizer's own size for a Vocabulary.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvq/model.h"
#include "kvq/status.h"
#include "text/tokenizer.h"

namespace kvq {

std::vector<int32_t> TokenizeWith(const Tokenizer& tokenizer, std::string_view text, AddBos add_bos);
Result<std::string> DetokenizeWith(const Tokenizer& tokenizer, int32_t vocab_size, std::span<const int32_t> ids);
std::string TokenTextWith(const Tokenizer& tokenizer, int32_t vocab_size, int32_t previous, int32_t token);
std::string TokenPieceWith(const Tokenizer& tokenizer, int32_t vocab_size, int32_t id);

}  // namespace kvq
