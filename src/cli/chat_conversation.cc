// ChatConversation (chat_conversation.h): a turn = render, fit the context, keep the cached common
// prefix, Generate; and the conversation's save file.
#include "cli/chat_conversation.h"

#include <fmt/core.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

namespace kvq::cli {

void ChatConversation::SetLastReplyCalls(std::string content, std::vector<ToolCall> calls) {
  if (messages_.empty() || messages_.back().role != "assistant") return;
  messages_.back().content = std::move(content);
  messages_.back().tool_calls = std::move(calls);
}

std::vector<ToolCall> ChatConversation::PendingCalls() const {
  std::set<std::string> answered;  // tool_call_id of each result after the last reply
  for (auto m = messages_.rbegin(); m != messages_.rend(); ++m) {
    if (m->role == "tool") {
      answered.insert(m->tool_call_id);
      continue;
    }
    if (m->role != "assistant") return {};
    std::vector<ToolCall> pending;
    for (const ToolCall& c : m->tool_calls) {
      if (!answered.contains(c.id)) pending.push_back(c);
    }
    return pending;
  }
  return {};
}

size_t ValidUtf8Length(std::string_view text, size_t i) {
  // Strict UTF-8 (RFC 3629: no overlong forms, surrogates or code points past U+10FFFF), as JSON
  // writers demand, so that a saved or printed reply is the text the template rendered.
  auto cont = [&](size_t at) { return at < text.size() && (static_cast<uint8_t>(text[at]) & 0xC0) == 0x80; };
  const auto b = static_cast<uint8_t>(text[i]);
  if (b < 0x80) return 1;
  if (b >= 0xC2 && b <= 0xDF) return cont(i + 1) ? 2 : 0;
  const auto b1 = i + 1 < text.size() ? static_cast<uint8_t>(text[i + 1]) : 0;
  if (b >= 0xE0 && b <= 0xEF) {
    const bool ok1 = b == 0xE0 ? (b1 >= 0xA0 && b1 <= 0xBF) : b == 0xED ? (b1 >= 0x80 && b1 <= 0x9F) : cont(i + 1);
    return ok1 && cont(i + 2) ? 3 : 0;
  }
  if (b >= 0xF0 && b <= 0xF4) {
    const bool ok1 = b == 0xF0 ? (b1 >= 0x90 && b1 <= 0xBF) : b == 0xF4 ? (b1 >= 0x80 && b1 <= 0x8F) : cont(i + 1);
    return ok1 && cont(i + 2) && cont(i + 3) ? 4 : 0;
  }
  return 0;
}

std::string ValidUtf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const size_t n = ValidUtf8Length(text, i);
    if (n == 0) {
      out += "\xEF\xBF\xBD";  // U+FFFD for the one bad byte
      ++i;
    } else {
      out.append(text.substr(i, n));
      i += n;
    }
  }
  return out;
}

ChatConversation::ChatConversation(const Model& model, Session& session, ChatTemplateOptions render,
                                   std::string system_prompt, int32_t reply_room)
    : model_(model),
      session_(session),
      render_(std::move(render)),
      system_prompt_(ValidUtf8(system_prompt)),
      reply_room_(reply_room) {
  if (!system_prompt_.empty()) messages_.push_back({"system", system_prompt_});
}

size_t ChatConversation::FirstDroppable() const {
  return !messages_.empty() && messages_.front().role == "system" ? 1 : 0;
}

Status ChatConversation::RenderFitting(std::string* text, std::vector<int32_t>* ids, int32_t* dropped) {
  const int64_t context = session_.context();
  const int64_t room = std::max<int32_t>(reply_room_, 0);
  for (*dropped = 0;;) {
    Result<std::string> rendered = model_.ApplyChatTemplate(messages_, render_);
    if (!rendered.ok()) return rendered.status();
    *ids = model_.TokenizeChatPrompt(*rendered);
    // The prompt, room for the reply, and at least one position for it.
    const int64_t need = static_cast<int64_t>(ids->size()) + std::max<int64_t>(room, 1);
    if (need <= context) {
      *text = std::move(rendered).value();
      return Status::Ok();
    }
    // Drop the oldest exchange: a user message and all that answers it (replies, their calls and
    // the calls' results) up to the next user message, so no result outlives its call. The newest
    // exchange stays.
    const size_t first = FirstDroppable();
    size_t next = first + 1;
    while (next < messages_.size() && messages_[next].role != "user") ++next;
    if (next >= messages_.size()) {
      return Status::Error(fmt::format("the message does not fit the context: the prompt is {} tokens, {} more "
                                       "are kept for the reply (-n), the context holds {} (-c)",
                                       ids->size(), std::max<int64_t>(room, 1), context));
    }
    messages_.erase(messages_.begin() + static_cast<std::ptrdiff_t>(first),
                    messages_.begin() + static_cast<std::ptrdiff_t>(next));
    *dropped += static_cast<int32_t>(next - first);
  }
}

Result<ChatTurn> ChatConversation::Reply(std::vector<ChatMessage> added, const GenerateRequest& request,
                                         const TokenCallback& on_token) {
  const std::vector<ChatMessage> before = messages_;
  const size_t n_added = added.size();
  for (ChatMessage& m : added) {
    m.content = ValidUtf8(m.content);
    messages_.push_back(std::move(m));
  }
  ChatTurn turn;
  if (Status s = RenderFitting(&turn.prompt, &turn.prompt_ids, &turn.dropped_messages); !s.ok()) {
    messages_ = before;
    return s;
  }
  // Keep what the session holds up to where it and the new prompt first differ, so Generate
  // reuses it and prefills only the rest.
  if (Result<int64_t> kept = session_.KeepCommonPrefix(turn.prompt_ids); !kept.ok()) {
    messages_ = before;
    return kept.status();
  }
  Result<Completion> c = session_.Generate(turn.prompt_ids, request, on_token);
  if (!c.ok()) {
    messages_ = before;
    return c.status();
  }
  turn.completion = std::move(c).value();
  const int64_t n_prompt = turn.completion.n_prompt;
  turn.prefilled = static_cast<int32_t>(std::min<int64_t>(session_.positions(), n_prompt) - turn.completion.n_reused);
  turn.positions = session_.positions();
  turn.reply = ValidUtf8(turn.completion.text);
  if (turn.completion.finish == FinishReason::kCancelled && turn.completion.tokens.empty()) {
    // Stopped before the reply began: as if the messages were not sent.
    messages_.resize(messages_.size() - n_added);
  } else {
    messages_.push_back({"assistant", turn.reply});
  }
  return turn;
}

Status ChatConversation::Clear() {
  messages_.clear();
  if (!system_prompt_.empty()) messages_.push_back({"system", system_prompt_});
  return session_.Clear();
}

Status ChatConversation::Save(const std::string& path) const {
  nlohmann::json messages = nlohmann::json::array();
  for (const ChatMessage& m : messages_) {
    nlohmann::json message = {{"role", m.role}, {"content", m.content}};
    for (const ToolCall& c : m.tool_calls) {
      message["tool_calls"].push_back(
          {{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
    }
    if (!m.tool_call_id.empty()) message["tool_call_id"] = m.tool_call_id;
    if (!m.name.empty()) message["name"] = m.name;
    messages.push_back(std::move(message));
  }
  const nlohmann::json doc = {{"messages", messages},
                              {"kv_snapshot", std::filesystem::path(SnapshotPath(path)).filename().string()}};
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << doc.dump(1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    if (!out) return Status::Error(fmt::format("{}: cannot write the conversation", path));
  }
  if (session_.positions() == 0) {  // nothing cached yet: no snapshot, and none left from before
    std::error_code ignored;
    std::filesystem::remove(SnapshotPath(path), ignored);
    return Status::Ok();
  }
  if (Status s = session_.SavePrefix(SnapshotPath(path)); !s.ok()) {
    return Status::Error(fmt::format("{}: the KV snapshot: {}", SnapshotPath(path), s.message()));
  }
  return Status::Ok();
}

namespace {

// A saved message's tool fields, as Save writes them; `where` names the message in errors.
Status ReadToolFields(const nlohmann::json& m, const std::string& where, ChatMessage* message) {
  if (m.contains("tool_calls")) {
    if (!m["tool_calls"].is_array()) return Status::Error(where + ".tool_calls must be an array");
    for (size_t k = 0; k < m["tool_calls"].size(); ++k) {
      const nlohmann::json& c = m["tool_calls"][k];
      const bool ok = c.is_object() && c.contains("id") && c["id"].is_string() && c.contains("function") &&
                      c["function"].is_object() && c["function"].contains("name") &&
                      c["function"]["name"].is_string() && c["function"].contains("arguments") &&
                      c["function"]["arguments"].is_string();
      if (!ok) {
        return Status::Error(fmt::format("{}.tool_calls[{}] must be {{\"id\", \"function\": {{\"name\", "
                                         "\"arguments\"}}}} with string values", where, k));
      }
      message->tool_calls.push_back({.id = c["id"].get<std::string>(),
                                     .name = c["function"]["name"].get<std::string>(),
                                     .arguments = c["function"]["arguments"].get<std::string>()});
    }
  }
  for (auto [key, out] : {std::pair{"tool_call_id", &message->tool_call_id}, std::pair{"name", &message->name}}) {
    if (!m.contains(key)) continue;
    if (!m[key].is_string()) return Status::Error(fmt::format("{}.{} must be a string", where, key));
    *out = m[key].get<std::string>();
  }
  return Status::Ok();
}

}  // namespace

Status ChatConversation::Load(const std::string& path, std::string* note) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::Error(fmt::format("{}: cannot read the file", path));
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json doc = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) return Status::Error(fmt::format("{}: not a JSON object", path));
  if (!doc.contains("messages") || !doc["messages"].is_array()) {
    return Status::Error(fmt::format("{}: \"messages\" must be an array of {{\"role\", \"content\"}} objects", path));
  }
  std::vector<ChatMessage> messages;
  for (size_t i = 0; i < doc["messages"].size(); ++i) {
    const nlohmann::json& m = doc["messages"][i];
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string() || !m.contains("content") ||
        !m["content"].is_string()) {
      return Status::Error(fmt::format("{}: messages[{}] must be an object with string \"role\" and \"content\"",
                                       path, i));
    }
    ChatMessage message{m["role"].get<std::string>(), m["content"].get<std::string>()};
    if (Status s = ReadToolFields(m, fmt::format("{}: messages[{}]", path, i), &message); !s.ok()) return s;
    messages.push_back(std::move(message));
  }
  messages_ = std::move(messages);
  note->clear();
  const std::string snapshot = SnapshotPath(path);
  if (!std::filesystem::exists(snapshot)) {
    *note = fmt::format("no KV snapshot {}: the next turn recomputes the conversation", snapshot);
    return session_.Clear();
  }
  if (Result<int64_t> n = session_.LoadPrefix(snapshot); !n.ok()) {
    *note = fmt::format("the KV snapshot {} was not loaded ({}): the next turn recomputes the conversation",
                        snapshot, n.status().message());
    return session_.Clear();
  }
  return Status::Ok();
}

}  // namespace kvq::cli
