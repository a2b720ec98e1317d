// kvq's public C++ API: a reply's reasoning split from its answer. Reasoning models (Qwen 3,
// DeepSeek R1 and its distillations) write their thoughts between `<think>` and `</think>` before
// the answer; llama-server (`--reasoning-format deepseek`, its default) and vLLM (`--reasoning-parser`)
// return them apart, as `reasoning_content`. The parser runs before the tool-call parser, which
// then sees the answer only.
//
//   kvq::ReasoningParser reasoning(kvq::ReasoningFormat::kDeepSeek, kvq::PromptOpensThinking(prompt));
//   kvq::ReasoningParser::Delta d = reasoning.Add(step.text);  // per step; then reasoning.Finish()
//
// Rules (the same streamed or whole: a whole reply is one Add):
// - The reply is in its thoughts when it starts (after whitespace) with `<think>`, or when the
//   prompt already ends with `<think>` (DeepSeek R1's template opens it for the model).
// - The thoughts run to `</think>`; the tags are not released, nor whitespace at the thoughts'
//   start and end and at the answer's start (the template's padding around the tags).
// - A reply whose `</think>` never comes (max_tokens ran out mid-thought) is all reasoning and no
//   answer: what it wrote is a thought, not a reply to show as one.
// - Any other reply is content, byte for byte.
#pragma once

#include <string>
#include <string_view>

#include "kvq/status.h"

namespace kvq {

enum class ReasoningFormat {
  kNone,      ///< thoughts stay in the content, tags and all
  kDeepSeek,  ///< thoughts go to `reasoning` (llama-server's "deepseek" and "auto")
};

/// "none", "deepseek" or "auto" (the deepseek split, as llama-server's default); an error naming
/// the values otherwise.
Result<ReasoningFormat> ParseReasoningFormat(std::string_view name);
const char* ReasoningFormatName(ReasoningFormat format);

/// Whether a rendered prompt leaves the model inside its thoughts: it ends (before trailing
/// whitespace) with `<think>`.
bool PromptOpensThinking(std::string_view prompt);

class ReasoningParser {
 public:
  struct Delta {
    std::string reasoning;  ///< thought text, without the tags
    std::string content;    ///< the answer's text
  };
  explicit ReasoningParser(ReasoningFormat format, bool starts_thinking = false);
  Delta Add(std::string_view text);
  Delta Finish();
  /// Whether the text so far ends inside the thoughts.
  bool thinking() const { return state_ == State::kThinking || state_ == State::kThinkingStart; }

 private:
  enum class State { kStart, kThinkingStart, kThinking, kAnswerStart, kAnswer };
  void Drain(bool final, Delta* out);

  ReasoningFormat format_;
  State state_;
  std::string buffer_;  // text not yet released
};

/// A whole reply split at once (ReasoningParser on the whole text).
ReasoningParser::Delta SplitReasoning(ReasoningFormat format, std::string_view text, bool starts_thinking = false);

}  // namespace kvq
