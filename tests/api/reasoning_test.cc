// A reply's reasoning split from its answer (include/kvq/reasoning.h), and the chat reply parser
// that chains it before the tool-call parser: every case split whole equals the same reply fed a
// byte at a time, and the split never loses or invents a byte of thought or answer.
#include "kvq/reasoning.h"

#include <gtest/gtest.h>

#include <string>

#include "kvq/tool_calls.h"

namespace kvq {
namespace {

ReasoningParser::Delta ByteAtATime(ReasoningFormat format, std::string_view text, bool starts_thinking = false) {
  ReasoningParser p(format, starts_thinking);
  ReasoningParser::Delta all;
  auto take = [&](const ReasoningParser::Delta& d) {
    all.reasoning += d.reasoning;
    all.content += d.content;
  };
  for (char c : text) take(p.Add(std::string_view(&c, 1)));
  take(p.Finish());
  return all;
}

struct Case {
  const char* reply;
  bool starts_thinking;
  const char* reasoning;
  const char* content;
};

TEST(Reasoning, DeepSeekSplitsThoughtsFromTheAnswerWholeAndStreamed) {
  const Case cases[] = {
      // Qwen 3's shape: the tags on their own lines, a blank line before the answer.
      {"<think>\nThe user greets.\n</think>\n\nHello!", false, "The user greets.", "Hello!"},
      // Whitespace inside a thought is kept; only its ends are padding.
      {"  <think>a\n\n b </think>c d ", false, "a\n\n b", "c d "},
      // No thoughts: content byte for byte, leading whitespace and tag-like text included.
      {"  Hello <think>x</think>", false, "", "  Hello <think>x</think>"},
      {"<thin", false, "", "<thin"},
      {"", false, "", ""},
      // Qwen 3 with enable_thinking false: the template wrote an empty thought, the reply has none.
      {"Hi.", false, "", "Hi."},
      // DeepSeek R1's template opens the thought in the prompt: the reply starts inside it.
      {"Let me see.\n</think>\n\n42", true, "Let me see.", "42"},
      // max_tokens ran out mid-thought: all of it is reasoning, no answer.
      {"<think>\nStep 1. Step 2 <", false, "Step 1. Step 2 <", ""},
      {"Step 1 </thi", true, "Step 1 </thi", ""},
  };
  for (const Case& c : cases) {
    for (const ReasoningParser::Delta& d : {SplitReasoning(ReasoningFormat::kDeepSeek, c.reply, c.starts_thinking),
                                            ByteAtATime(ReasoningFormat::kDeepSeek, c.reply, c.starts_thinking)}) {
      EXPECT_EQ(d.reasoning, c.reasoning) << c.reply;
      EXPECT_EQ(d.content, c.content) << c.reply;
    }
  }
}

TEST(Reasoning, NoneLeavesTheReplyAsContent) {
  const std::string reply = "<think>\nhm\n</think>\n\nHello!";
  for (const ReasoningParser::Delta& d : {SplitReasoning(ReasoningFormat::kNone, reply),
                                          ByteAtATime(ReasoningFormat::kNone, reply)}) {
    EXPECT_EQ(d.reasoning, "");
    EXPECT_EQ(d.content, reply);
  }
}

TEST(Reasoning, FormatsAndOpenPromptsAreNamed) {
  EXPECT_EQ(*ParseReasoningFormat("none"), ReasoningFormat::kNone);
  EXPECT_EQ(*ParseReasoningFormat("deepseek"), ReasoningFormat::kDeepSeek);
  EXPECT_EQ(*ParseReasoningFormat("auto"), ReasoningFormat::kDeepSeek);
  Result<ReasoningFormat> bad = ParseReasoningFormat("r1");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "reasoning format 'r1': expected none, deepseek or auto");
  EXPECT_TRUE(PromptOpensThinking("<|im_start|>assistant\n<think>\n"));
  EXPECT_FALSE(PromptOpensThinking("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  EXPECT_FALSE(PromptOpensThinking("<|im_start|>assistant\n"));
}

TEST(Reasoning, ToolCallsAreFoundInTheAnswerOnly) {
  const ToolCallFormat& hermes = *FindToolCallFormat("hermes");
  const std::string reply =
      "<think>\nI could write <tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call> here.\n</think>\n\n"
      "<tool_call>\n{\"name\": \"g\", \"arguments\": {\"x\": 1}}\n</tool_call>";
  ReplyParser streamed(ReasoningFormat::kDeepSeek, false, &hermes);
  ReplyParser::Delta all;
  for (char c : reply) {
    ReplyParser::Delta d = streamed.Add(std::string_view(&c, 1));
    all.reasoning += d.reasoning;
    all.content += d.content;
    all.calls.insert(all.calls.end(), d.calls.begin(), d.calls.end());
  }
  ReplyParser::Delta end = streamed.Finish();
  all.calls.insert(all.calls.end(), end.calls.begin(), end.calls.end());
  for (const ReplyParser::Delta& d : {SplitReply(ReasoningFormat::kDeepSeek, false, &hermes, reply), all}) {
    EXPECT_EQ(d.reasoning, "I could write <tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call> here.");
    EXPECT_EQ(d.content, "");
    ASSERT_EQ(d.calls.size(), 1u);
    EXPECT_EQ(d.calls[0].name, "g");
    EXPECT_EQ(d.calls[0].arguments, "{\"x\": 1}");
  }
  // Without the split the thought's call would be taken for a call.
  EXPECT_EQ(SplitReply(ReasoningFormat::kNone, false, &hermes, reply).calls.size(), 2u);
}

}  // namespace
}  // namespace kvq
