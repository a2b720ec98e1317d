// Generator (see include/kvq/generator.h): end tokens, max_tokens, stop strings, the context and
// the hold-back of text that a later token may still change.
#include "kvq/generator.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <limits>

#include "api/api_internal.h"
#include "grammar/grammar.h"
#include "grammar/grammar_matcher.h"
#include "grammar/json_schema.h"

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

Result<std::string> JsonSchemaGrammar(std::string_view schema_json) { return JsonSchemaToGbnf(schema_json); }

std::string JsonObjectGrammar() { return JsonObjectGbnf(); }

Generator::~Generator() = default;
Generator::Generator(Generator&&) noexcept = default;
Generator& Generator::operator=(Generator&&) noexcept = default;

Status Generator::Check(const GeneratorOptions& options) {
  if (!options.grammar.empty()) {
    if (Result<Grammar> g = ParseGbnf(options.grammar); !g.ok()) {
      return Status::Error("GeneratorOptions::grammar: " + g.status().message());
    }
  }
  for (size_t i = 0; i < options.stop.size(); ++i) {
    if (options.stop[i].empty()) {
      return Status::Error(fmt::format("GeneratorOptions::stop[{}] is empty (a stop string has at least one byte)", i));
    }
  }
  for (size_t i = 0; i < options.preserved_tokens.size(); ++i) {
    if (options.preserved_tokens[i].empty()) {
      return Status::Error(
          fmt::format("GeneratorOptions::preserved_tokens[{}] is empty (expected a control "
                      "token's text, e.g. \"[TOOL_CALLS]\")",
                      i));
    }
  }
  return Status::Ok();
}

Result<Generator> Generator::Create(const Session& session, const GeneratorOptions& options) {
  if (session.tokens().empty()) {
    return Status::Error("Generator: the session holds no tokens (run the prompt first: its logits give the "
                         "first token)");
  }
  return Make(session.impl_->model, session.tokens().back(), session.positions(), session.context(), options);
}

Result<Generator> Generator::Create(const Model& model, int32_t last_token, int64_t positions, int64_t context,
                                   const GeneratorOptions& options) {
  if (last_token < 0 || last_token >= model.info().vocab_size) {
    return Status::Error(fmt::format("Generator: the last token run, {}, is outside the vocabulary [0, {})",
                                     last_token, model.info().vocab_size));
  }
  if (positions < 1 || context < positions) {
    return Status::Error(fmt::format("Generator: {} positions held in a context of {} (expected 1 <= positions <= "
                                     "context: the prompt runs first, its logits give the first token)",
                                     positions, context));
  }
  return Make(model.impl_, last_token, positions, context, options);
}

Result<Generator> Generator::Make(std::shared_ptr<const Model::Impl> model, int32_t last_token, int64_t positions,
                                  int64_t context, const GeneratorOptions& options) {
  if (Status s = Check(options); !s.ok()) return s;
  std::unique_ptr<GrammarMatcher> grammar;
  if (!options.grammar.empty()) {
    Result<Grammar> g = ParseGbnf(options.grammar);  // parsed by Check already: cannot fail
    if (!g.ok()) return Status::Error("GeneratorOptions::grammar: " + g.status().message());
    grammar = std::make_unique<GrammarMatcher>(std::make_shared<const Grammar>(std::move(g).value()));
  }
  std::vector<std::pair<int32_t, std::string>> preserved;
  for (const std::string& text : options.preserved_tokens) {
    if (const int32_t id = model->ControlToken(text); id >= 0 && !IsEndOfGeneration(*model, id)) {
      preserved.emplace_back(id, text);
    }
  }
  Generator g(std::move(model), options, last_token, positions, context, std::move(grammar));
  g.preserved_ = std::move(preserved);
  return g;
}

Generator::Generator(std::shared_ptr<const Model::Impl> model, GeneratorOptions options, int32_t previous,
                     int64_t positions, int64_t context, std::unique_ptr<GrammarMatcher> grammar)
    : model_(std::move(model)), options_(std::move(options)), previous_(previous), positions_(positions),
      context_(context), grammar_(std::move(grammar)) {
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

void Generator::Constrain(std::span<float> logits) {
  if (!grammar_ || finished_) return;
  const std::vector<int32_t>& ends = model_->end_tokens();
  const std::vector<uint64_t>& allowed = grammar_->AllowedTokens(model_->token_trie());
  const size_t n = std::min(logits.size(), allowed.size() * 64);
  constexpr float kRefused = -std::numeric_limits<float>::infinity();
  end_logits_.resize(ends.size());
  for (size_t i = 0; i < ends.size(); ++i) end_logits_[i] = logits[ends[i]];
  preserved_logits_.resize(preserved_.size());
  for (size_t i = 0; i < preserved_.size(); ++i) preserved_logits_[i] = logits[preserved_[i].first];
  bool any = false;
  for (size_t w = 0; w * 64 < n; ++w) {
    const uint64_t bits = allowed[w];
    any = any || bits != 0;
    if (bits == ~uint64_t{0}) continue;
    const size_t end = std::min(n, w * 64 + 64);
    if (bits == 0) {  // most words where the grammar asks for punctuation: one fill, vectorised
      std::fill(logits.begin() + w * 64, logits.begin() + end, kRefused);
      continue;
    }
    for (uint64_t refused = ~bits; refused != 0; refused &= refused - 1) {  // each clear bit
      const size_t t = w * 64 + static_cast<size_t>(std::countr_zero(refused));
      if (t >= end) break;
      logits[t] = kRefused;
    }
  }
  // Kept control tokens are not in the trie (their text is ""): each is allowed where the grammar
  // takes its text.
  std::vector<std::string_view> kept;  // the texts of the control tokens allowed here
  for (size_t i = 0; i < preserved_.size(); ++i) {
    if (grammar_->Allows(preserved_[i].second)) {
      logits[preserved_[i].first] = preserved_logits_[i];
      kept.push_back(preserved_[i].second);
    }
  }
  if (!kept.empty() && !grammar_->CanEnd()) {
    // Where every other token allowed only begins a control token's text, the grammar is asking
    // for that control token (the format's opening): spelling its text in pieces would give a
    // reply the model's own tokenizer never writes, so the pieces are refused.
    auto begins_kept = [&](int32_t t) {
      if (std::any_of(preserved_.begin(), preserved_.end(), [&](const auto& p) { return p.first == t; })) {
        return true;
      }
      const std::string text = kvq::TokenText(*model_, previous_, t);
      return std::any_of(kept.begin(), kept.end(), [&](std::string_view k) {
        return text.size() < k.size() && k.starts_with(text);
      });
    };
    bool only_pieces = true;
    for (size_t t = 0; t < n && only_pieces; ++t) {
      if (logits[t] != kRefused && !IsEndOfGeneration(*model_, static_cast<int32_t>(t))) {
        only_pieces = begins_kept(static_cast<int32_t>(t));
      }
    }
    if (only_pieces) {
      for (size_t t = 0; t < n; ++t) {
        const bool control = std::any_of(preserved_.begin(), preserved_.end(), [&](const auto& p) {
          return p.first == static_cast<int32_t>(t);
        });
        if (!control && logits[t] != kRefused) logits[t] = kRefused;
      }
    }
  }
  any = any || !kept.empty();
  if (grammar_->CanEnd() || !any) {
    for (size_t i = 0; i < ends.size(); ++i) logits[ends[i]] = end_logits_[i];
  }
}

std::string Generator::TokenText(int32_t previous, int32_t token) const {
  std::string piece = kvq::TokenText(*model_, previous, token);
  if (piece.empty()) {  // a control token kept as text (GeneratorOptions::preserved_tokens)
    for (const auto& [id, text] : preserved_) {
      if (id == token) piece = text;
    }
  }
  return piece;
}

GeneratorStep Generator::Next(int32_t token) {
  if (finished_) return {.finished = true, .finish = finish_};
  // An end token (for llama2.c vocabularies BOS too: Tokenizer::IsEndOfGeneration) ends the text
  // unkept; what was held back for a stop string that never came is released.
  const bool end = IsEndOfGeneration(*model_, token);
  if (end && !options_.ignore_eos) return Finish(FinishReason::kStop, /*kept=*/false, text_.size());

  const std::string piece = TokenText(previous_, token);
  if (grammar_ && !grammar_->Accept(piece)) return Finish(FinishReason::kStop, /*kept=*/false, text_.size());
  tokens_.push_back(token);
  text_ += piece;
  previous_ = token;
  // A stop string ends the text before it. Released text never holds the start of a match (the
  // hold-back keeps every end that is a prefix of one), so the search starts at released_.
  size_t stop_at = std::string::npos;
  for (const std::string& s : options_.stop) stop_at = std::min(stop_at, text_.find(s, released_));
  if (stop_at != std::string::npos) {
    text_.resize(stop_at);
    return Finish(FinishReason::kStop, /*kept=*/true, stop_at);
  }
  if (grammar_ && grammar_->Done()) return Finish(FinishReason::kStop, /*kept=*/true, text_.size());
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
