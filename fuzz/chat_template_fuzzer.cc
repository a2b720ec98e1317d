// Fuzz target: chat templates (jinja/chat_template.h), which come from downloaded model files. The
// input is a template, then, after the first NUL byte if there is one, the text of a user message.
// ChatTemplate::Parse, then Render of a four-message conversation with small limits (so that a
// render stays fast and its allocations within the resource property). Properties: both return,
// never crash, hang or leak; a parsed template keeps its source; a render's text is within
// max_output_bytes.
#include <cstdint>
#include <string_view>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "jinja/chat_template.h"

namespace kvq::fuzz {

int FuzzChatTemplate(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  const std::string_view source = input.substr(0, nul);
  const std::string_view content =
      nul == std::string_view::npos ? "Hi {{ x }}" : input.substr(nul + 1);
  Result<ChatTemplate> t = ChatTemplate::Parse(source);
  if (!t.ok()) return 0;
  if (t->source() != source) Fail("chat_template", "source() is not the parsed text");
  const std::vector<ChatMessage> messages = {{"system", "Be brief."},
                                             {"user", std::string(content)},
                                             {"assistant", "<think>\nhm\n</think>\n\nYes."},
                                             {"user", "And?"}};
  ChatRenderOptions options;
  options.bos_token = "<s>";
  options.eos_token = "</s>";
  options.enable_thinking = (size & 1) != 0;
  options.now = std::chrono::sys_seconds(std::chrono::seconds(1767225600));  // 2026-01-01
  options.limits = {
      .max_steps = 200'000, .max_created_bytes = 256 << 10, .max_output_bytes = 64 << 10};
  Result<std::string> r = t->Render(messages, options);
  if (r.ok() && r->size() > options.limits.max_output_bytes) {
    Fail("chat_template", "a render longer than max_output_bytes");
  }
  return 0;
}

}  // namespace kvq::fuzz

KVQ_FUZZ_TARGET(FuzzChatTemplate)
