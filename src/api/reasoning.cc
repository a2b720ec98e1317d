// A reply's reasoning split from its answer (include/kvq/reasoning.h).
#include "kvq/reasoning.h"

#include <fmt/format.h>

#include <algorithm>

namespace kvq {
namespace {

constexpr std::string_view kOpen = "<think>";
constexpr std::string_view kClose = "</think>";

bool IsSpace(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

size_t LeadingSpace(std::string_view text) {
  size_t n = 0;
  while (n < text.size() && IsSpace(text[n])) ++n;
  return n;
}

size_t TrailingSpace(std::string_view text) {
  size_t n = 0;
  while (n < text.size() && IsSpace(text[text.size() - 1 - n])) ++n;
  return n;
}

// Length of the longest suffix of `text` that is a proper prefix of `marker`.
size_t PartialMarker(std::string_view text, std::string_view marker) {
  for (size_t n = std::min(text.size(), marker.size() - 1); n > 0; --n) {
    if (marker.starts_with(text.substr(text.size() - n))) return n;
  }
  return 0;
}

}  // namespace

Result<ReasoningFormat> ParseReasoningFormat(std::string_view name) {
  if (name == "none") return ReasoningFormat::kNone;
  if (name == "deepseek" || name == "auto") return ReasoningFormat::kDeepSeek;
  return Status::Error(fmt::format("reasoning format '{}': expected none, deepseek or auto", name));
}

const char* ReasoningFormatName(ReasoningFormat format) {
  return format == ReasoningFormat::kNone ? "none" : "deepseek";
}

bool PromptOpensThinking(std::string_view prompt) {
  prompt.remove_suffix(TrailingSpace(prompt));
  return prompt.ends_with(kOpen);
}

ReasoningParser::ReasoningParser(ReasoningFormat format, bool starts_thinking)
    : format_(format),
      state_(format == ReasoningFormat::kNone ? State::kAnswer
             : starts_thinking                ? State::kThinkingStart
                                              : State::kStart) {}

ReasoningParser::Delta ReasoningParser::Add(std::string_view text) {
  buffer_ += text;
  Delta d;
  Drain(false, &d);
  return d;
}

ReasoningParser::Delta ReasoningParser::Finish() {
  Delta d;
  Drain(true, &d);
  return d;
}

void ReasoningParser::Drain(bool final, Delta* out) {
  for (;;) {
    switch (state_) {
      case State::kStart: {  // does the reply open its thoughts?
        const std::string_view rest = std::string_view(buffer_).substr(LeadingSpace(buffer_));
        if (rest.starts_with(kOpen)) {
          buffer_.erase(0, buffer_.size() - rest.size() + kOpen.size());
          state_ = State::kThinkingStart;
          continue;
        }
        if (!final && kOpen.starts_with(rest)) return;  // whitespace, or a part of the tag: wait
        state_ = State::kAnswer;
        continue;
      }
      case State::kThinkingStart:  // whitespace after the opening tag is not a thought
        buffer_.erase(0, LeadingSpace(buffer_));
        if (buffer_.empty() && !final) return;
        state_ = State::kThinking;
        continue;
      case State::kThinking: {
        const size_t at = buffer_.find(kClose);
        if (at != std::string::npos) {
          std::string_view thought(buffer_.data(), at);
          thought.remove_suffix(TrailingSpace(thought));
          out->reasoning += thought;
          buffer_.erase(0, at + kClose.size());
          state_ = State::kAnswerStart;
          continue;
        }
        if (final) {  // never closed: all of it was thought
          std::string_view thought(buffer_);
          thought.remove_suffix(TrailingSpace(thought));
          out->reasoning += thought;
          buffer_.clear();
          return;
        }
        // Hold what may begin the closing tag, and whitespace that may precede it.
        const size_t partial = PartialMarker(buffer_, kClose);
        const size_t hold = partial + TrailingSpace(std::string_view(buffer_).substr(0, buffer_.size() - partial));
        out->reasoning += buffer_.substr(0, buffer_.size() - hold);
        buffer_.erase(0, buffer_.size() - hold);
        return;
      }
      case State::kAnswerStart:
        buffer_.erase(0, LeadingSpace(buffer_));
        if (buffer_.empty()) return;
        state_ = State::kAnswer;
        continue;
      case State::kAnswer:
        out->content += buffer_;
        buffer_.clear();
        return;
    }
  }
}

ReasoningParser::Delta SplitReasoning(ReasoningFormat format, std::string_view text, bool starts_thinking) {
  ReasoningParser parser(format, starts_thinking);
  ReasoningParser::Delta all = parser.Add(text);
  ReasoningParser::Delta end = parser.Finish();
  all.reasoning += end.reasoning;
  all.content += end.content;
  return all;
}

}  // namespace kvq
