// Generator (see include/kvq/generator.h): end tokens, max_tokens, stop strings, the context and
// the hold-back of text that a later token may still change.
#include "kvq/generator.h"

#include <fmt/format.h>

#include <algorithm>

#include "api/api_internal.h"

namespace kvq {

const char* FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kContext: return "context";
    case FinishReason::kCancelled: return "cancelled";
  }
  return "stop";
}

Status Generator::Check(const GeneratorOptions& options) {
  for (size_t i = 0; i < options.stop.size(); ++i) {
    if (options.stop[i].empty()) {
      return Status::Error(fmt::format("GeneratorOptions::stop[{}] is empty (a stop string has at least one byte)", i));
    }
  }
  return Status::Ok();
}

Result<Generator> Generator::Create(const Session& session, const GeneratorOptions& options) {
  if (Status s = Check(options); !s.ok()) return s;
  if (session.tokens().empty()) {
    return Status::Error("Generator: the session holds no tokens (run the prompt first: its logits give the "
                         "first token)");
  }
  return Generator(session.impl_->model, options, session.tokens().back(), session.positions(), session.context());
}

Generator::Generator(std::shared_ptr<const Model::Impl> model, GeneratorOptions options, int32_t previous,
                     int64_t positions, int64_t context)
    : model_(std::move(model)), options_(std::move(options)), previous_(previous), positions_(positions), context_(context) {
  if (options_.max_tokens == 0) {
    finished_ = true;
    finish_ = FinishReason::kLength;
  }
}

size_t Generator::HeldBytes() const {
  size_t hold = 0;
  // The longest end of the text that is a proper prefix of a stop string.
  for (const std::string& s : options_.stop) {
    for (size_t n = std::min(s.size() - 1, text_.size()); n > hold; --n) {
      if (text_.compare(text_.size() - n, n, s, 0, n) == 0) {
        hold = n;
        break;
      }
    }
  }
  // An incomplete UTF-8 sequence at the end: its lead byte says how many bytes it needs.
  for (size_t back = 1; back <= std::min<size_t>(3, text_.size()); ++back) {
    const unsigned char c = static_cast<unsigned char>(text_[text_.size() - back]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte: keep looking for the lead
    const size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    if (need > back) hold = std::max(hold, back);
    break;
  }
  return hold;
}

GeneratorStep Generator::Finish(FinishReason reason, bool kept, size_t release) {
  finished_ = true;
  finish_ = reason;
  GeneratorStep step{.kept = kept, .run = false, .finished = true, .finish = reason};
  if (release > released_) {
    step.text = text_.substr(released_, release - released_);
    released_ = release;
  }
  return step;
}

GeneratorStep Generator::Next(int32_t token) {
  if (finished_) return {.finished = true, .finish = finish_};
  // An end token (for llama2.c vocabularies BOS too: Tokenizer::IsEndOfGeneration) ends the text
  // unkept; what was held back for a stop string that never came is released.
  const bool end = IsEndOfGeneration(*model_, token);
  if (end && !options_.ignore_eos) return Finish(FinishReason::kStop, /*kept=*/false, text_.size());

  tokens_.push_back(token);
  text_ += TokenText(*model_, previous_, token);
  previous_ = token;
  // A stop string ends the text before it. Released text never holds the start of a match (the
  // hold-back keeps every end that is a prefix of one), so the search starts at released_.
  size_t stop_at = std::string::npos;
  for (const std::string& s : options_.stop) stop_at = std::min(stop_at, text_.find(s, released_));
  if (stop_at != std::string::npos) {
    text_.resize(stop_at);
    return Finish(FinishReason::kStop, /*kept=*/true, stop_at);
  }
  if (options_.max_tokens >= 0 && static_cast<int64_t>(tokens_.size()) >= options_.max_tokens) {
    return Finish(FinishReason::kLength, /*kept=*/true, text_.size());
  }
  if (positions_ >= context_) {  // no position left to run this token in
    return Finish(FinishReason::kContext, /*kept=*/true, text_.size());
  }
  ++positions_;  // the caller runs it
  GeneratorStep step{.kept = true, .run = true};
  const size_t safe = text_.size() - HeldBytes();
  if (safe > released_) {
    step.text = text_.substr(released_, safe - released_);
    released_ = safe;
  }
  return step;
}

GeneratorStep Generator::Cancel() {
  if (finished_) return {.finished = true, .finish = finish_};
  return Finish(FinishReason::kCancelled, /*kept=*/false, released_);
}

}  // namespace kvq
