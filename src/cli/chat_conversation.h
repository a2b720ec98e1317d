// kvq chat's conversation: the messages so far, rendered through the model's chat template each
// turn, and a session whose KV cache holds the conversation's tokens between turns, so a turn
// prefills only what is new.
//
// Each turn renders the whole conversation and tokenizes it; the session keeps the longest
// common prefix of what it holds and the new prompt (Session::Truncate drops the rest, exactly)
// and Generate runs the remainder. The prompt need not extend what the session holds: Qwen 3's
// template drops an earlier reply's <think> block, and a reply's text may tokenize differently
// than it was generated; the cache is cut back to where they agree, never cleared for it.
#pragma once

#include <string>
#include <vector>

#include "kvq/chat.h"
#include "kvq/model.h"
#include "kvq/session.h"

namespace kvq::cli {

/// What one turn did.
struct ChatTurn {
  std::string prompt;                // the rendered conversation the reply continues
  std::vector<int32_t> prompt_ids;   // its tokens
  std::string reply;                 // the assistant's text, as kept in the conversation
  Completion completion;             // Generate's result (ids, timings, finish reason)
  int32_t prefilled = 0;             // prompt tokens run this turn (the rest were reused)
  int32_t dropped_messages = 0;      // oldest messages (user, then its reply) dropped to fit the context
  int64_t positions = 0;             // what the session holds after the turn
};

class ChatConversation {
 public:
  /// `system_prompt` non-empty: the conversation's first message, kept by Clear and by the
  /// dropping of old turns. `reply_room`: new tokens a turn's prompt leaves room for (-n; <= 0:
  /// none reserved, the reply ends when the context is full).
  ChatConversation(const Model& model, Session& session, ChatTemplateOptions render, std::string system_prompt,
                   int32_t reply_room);

  /// Adds `added` (a user message, or the `tool` results of the last reply's calls), fits the
  /// conversation into the context (dropping the oldest exchanges, which the turn reports),
  /// renders and prefills what the session does not hold, and generates the reply, streaming it
  /// to on_token. A reply cut by Ctrl-C is kept as far as it got; one cancelled before its first
  /// token removes the added messages again. Errors: the template refuses the conversation, the
  /// newest exchange alone does not fit, a session error; the conversation is then as before.
  Result<ChatTurn> Reply(std::vector<ChatMessage> added, const GenerateRequest& request,
                         const TokenCallback& on_token);

  /// Back to the system prompt alone, and an empty cache.
  Status Clear();
  /// Writes the conversation to `path` (JSON: {"messages": [{"role", "content"}...]}, with an
  /// assistant's "tool_calls" and a tool result's "tool_call_id" and "name", as OpenAI writes them) and the
  /// session's KV cache beside it, `path`.kv (Session::SavePrefix: checksummed, tied to the model
  /// and KV formats).
  Status Save(const std::string& path) const;
  /// Reads a conversation saved by Save, replacing this one, and its KV snapshot when it exists
  /// and fits this model and these formats (else the next turn recomputes it; `note` says why).
  /// Errors: an unreadable file, or JSON that is not such a conversation (naming the field).
  Status Load(const std::string& path, std::string* note);

  const std::vector<ChatMessage>& messages() const { return messages_; }
  /// The last reply, as a tool-calling reply splits it: `content` and the calls it made (so the
  /// next turn renders them as the template writes calls). Nothing when the last message is not
  /// the assistant's.
  void SetLastReplyCalls(std::string content, std::vector<ToolCall> calls);
  /// The calls of the last assistant message that no `tool` message after it answers yet, in the
  /// order the reply made them.
  std::vector<ToolCall> PendingCalls() const;
  static std::string SnapshotPath(const std::string& path) { return path + ".kv"; }

 private:
  // The prompt of messages_ and its ids, dropping the oldest turns until it fits the context.
  Status RenderFitting(std::string* text, std::vector<int32_t>* ids, int32_t* dropped_messages);
  // The index of the first message a drop may remove (after the system prompt).
  size_t FirstDroppable() const;

  const Model& model_;
  Session& session_;
  ChatTemplateOptions render_;
  std::string system_prompt_;
  int32_t reply_room_;
  std::vector<ChatMessage> messages_;
};

/// The bytes of the valid UTF-8 character at text[at] (at < text.size()): 1 to 4, or 0 when the
/// byte there starts none (strict: no overlong forms, surrogates or code points past U+10FFFF).
size_t ValidUtf8Length(std::string_view text, size_t at);
/// `text` with each byte that is not part of valid UTF-8 replaced by U+FFFD: a reply of a few
/// tokens may end inside a character, and templates and JSON take text.
std::string ValidUtf8(std::string_view text);

}  // namespace kvq::cli
