// kvq's public C++ API: function calling — the formats in which chat models write tool calls, the
// grammar that forces a call, and the parser that finds calls in a reply (whole or streamed).
//
//   const kvq::ToolCallFormat& format = kvq::ToolCallFormatFor(model->info().chat_template);
//   kvq::ToolOptions tools{.tools_json = R"([{"type": "function", "function": {...}}])",
//                          .choice = kvq::ToolChoice::kRequired};
//   std::string gbnf = *kvq::ToolCallGrammar(format, tools);   // GeneratorOptions::grammar
//   kvq::ToolCallParser parser(format);
//   kvq::ToolCallParser::Delta d = parser.Add(step.text);      // per step; then parser.Finish()
//
// The tools reach the model through its chat template (ChatTemplateOptions::tools_json, and
// ChatMessage::tool_calls / role "tool" for the history); the template decides how they are
// shown. What the model writes back differs per family, so each format is one row of a table
// (ToolCallFormats) that tests iterate: Hermes' `<tool_call>{json}</tool_call>` (Qwen 2.5, Qwen 3,
// and kvq's choice for ChatML and templates without a format of their own), Llama 3.1's bare JSON
// object `{"name": ..., "parameters": ...}`, Mistral's `[TOOL_CALLS][{...}, ...]`, and DeepSeek V3's
// `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME` + a ```json block per call
// (the name outside the JSON).
//
// Some openings are control tokens (Mistral's `[TOOL_CALLS]`, Llama's `<|python_tag|>`), whose
// text is "" when detokenised: ToolCallFormat::preserved names them, and a surface passes them to
// GeneratorOptions::preserved_tokens, so that the grammar can ask for the token and the parser sees
// its text (which is never shown as content).
//
// A call streams as it is written (ToolCallParser's chunks), so one cut short keeps the arguments
// it wrote; a reply that opens a call it never names keeps that text as content. tool_choice auto
// gets a lazy grammar: free text until the format's opening, then only declared calls.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvq/chat.h"
#include "kvq/model.h"
#include "kvq/reasoning.h"
#include "kvq/status.h"

namespace kvq {

/// How one family of models writes its tool calls.
struct ToolCallFormat {
  const char* name;           ///< "hermes", "llama3_json", "mistral"
  const char* models;         ///< who writes it, for logs and help
  /// A chat template holding one of these texts (separated by newlines) uses the format; "" for the
  /// fallback (the table's first row).
  const char* detect;
  const char* open;           ///< text before the calls ("" for llama3_json: the reply is the call)
  const char* close;          ///< text after each call (Hermes), "" when the calls run to the end
  const char* arguments_key;  ///< the call object's key for the arguments
  bool array;                 ///< calls are one JSON array after `open` (Mistral)
  /// Length of the ids kvq gives calls: 9 (Mistral's template refuses other lengths), or 0 for
  /// OpenAI's "call_" and 24 letters and digits.
  int id_length;
  /// Calls written with the name outside the JSON (DeepSeek V3): each call is `call_open` NAME
  /// `name_end` ARGUMENTS `call_close`, the calls separated by whitespace, all of them between
  /// `open` and `close` (which then frame the calls together, not each call). "" for the formats
  /// whose calls are JSON objects `{"name": ..., arguments_key: ...}`.
  const char* call_open = "";
  const char* name_end = "";
  const char* call_close = "";
  /// Texts of the format's framing that are control tokens in its family's vocabularies (text ""
  /// when detokenised), separated by newlines: GeneratorOptions::preserved_tokens keeps them as
  /// text, and the parser never releases them as content. "" when the framing is plain text.
  const char* preserved = "";
  /// The template renders an earlier call only from a message whose content is none and whose
  /// arguments are a string (DeepSeek V3: it concatenates them); ApplyChatTemplate passes such
  /// messages so.
  bool calls_as_text = false;
};

/// Whether `format` writes the name outside the JSON (ToolCallFormat::call_open is not "").
inline bool NamedCalls(const ToolCallFormat& format) { return *format.call_open != '\0'; }
/// ToolCallFormat::preserved as a list (for GeneratorOptions::preserved_tokens).
std::vector<std::string> PreservedTokens(const ToolCallFormat& format);

/// Every format, the fallback (Hermes) first.
std::span<const ToolCallFormat> ToolCallFormats();
/// The format a chat template's model writes: the first row one of whose `detect` texts the
/// template holds, else Hermes. An empty template (ChatML) is Hermes.
const ToolCallFormat& ToolCallFormatFor(std::string_view template_source);
/// The format of the template `model` renders with: `template_override` when non-empty, else the
/// model's own (Hermes when it falls back to ChatML).
const ToolCallFormat& ToolCallFormatOf(const Model& model, std::string_view template_override = "");
/// Ok when kvq can force and parse the tool calls of the template `model` renders with (as
/// ToolCallFormatOf picks it); an error naming the format and why otherwise (a DeepSeek template
/// other than V3's and R1's, e.g. V3.1's `NAME<｜tool▁sep｜>{json}` calls), so that tools are refused
/// instead of asked in another format.
Status CheckToolCallTemplate(const Model& model, std::string_view template_override = "");
/// The row named `name`, or nullptr.
const ToolCallFormat* FindToolCallFormat(std::string_view name);

/// OpenAI's tool_choice.
enum class ToolChoice {
  kAuto,      ///< the model decides; calls in the reply are parsed
  kNone,      ///< no calls: the tools are shown to the template but the reply is text only
  kRequired,  ///< at least one call, of a declared function (forced by a grammar)
  kFunction,  ///< exactly one call of ToolOptions::function (forced by a grammar)
};

struct ToolOptions {
  /// JSON text of an array of OpenAI tool definitions: {"type": "function", "function": {"name",
  /// "description", "parameters": a JSON Schema}}.
  std::string tools_json;
  ToolChoice choice = ToolChoice::kAuto;
  std::string function;   ///< kFunction: the function's name
  bool parallel = true;   ///< kRequired and kAuto: more than one call may follow the first
  /// kAuto: the prompt leaves the model inside a thought (PromptOpensThinking), so the reply
  /// starts in it, free until `</think>`.
  bool starts_thinking = false;
};

/// The declared functions' names, in order. Errors name the field at fault ("tools[1].function.name
/// is missing"): tools_json not an array, a tool not of type "function", a name missing or
/// repeated, parameters not an object, a kFunction naming an undeclared function.
Result<std::vector<std::string>> CheckTools(const ToolOptions& options);

/// The GBNF (GeneratorOptions::grammar) of a reply that is exactly the calls `options.choice`
/// demands, in `format`: for kRequired one call (or more when parallel; one for llama3_json, which
/// has no parallel calls) of any declared function, for kFunction one call of that function, each
/// call's arguments following its function's parameters schema. "" for kAuto and kNone. Errors:
/// CheckTools', and a parameters schema JsonSchemaGrammar refuses (named by its tool).
Result<std::string> ToolCallGrammar(const ToolCallFormat& format, const ToolOptions& options);

/// One piece of a streamed call, as OpenAI streams `tool_calls[i]`: the call's first chunk carries
/// its id and name (and maybe the arguments' first bytes), later ones more bytes of its arguments.
struct ToolCallChunk {
  int index = 0;          ///< the call's place among the reply's calls, from 0
  std::string id;         ///< first chunk only, else ""
  std::string name;       ///< first chunk only, else ""
  std::string arguments;  ///< the next bytes of the arguments' JSON text
};

/// Finds the tool calls in a reply's text as it streams: Add each piece of text, then Finish.
/// Content (text that is not a call) is released as soon as it cannot be the start of a call.
/// A call written name first (`{"name": "f", "arguments": {...`, as every format's models write
/// it) is released as it is written: a chunk once its name and the start of its arguments are
/// known, then its arguments' bytes as they come. Its arguments are the model's own JSON text of
/// the object, so the chunks of a call concatenate to exactly its ToolCall::arguments, and a
/// reply parsed whole gives what its chunks give. Such a call is committed once its first chunk
/// is out: cut short (the reply ran out of tokens), it keeps the arguments written so far. A call
/// written otherwise (arguments first, or as a string) is released whole when it ends, as one
/// chunk; one that does not parse stays content. The deltas together hold every byte of the
/// reply as content or as a call, but for the format's framing around calls.
class ToolCallParser {
 public:
  struct Delta {
    std::string content;                ///< text to show
    std::vector<ToolCall> calls;        ///< calls completed by this piece
    std::vector<ToolCallChunk> chunks;  ///< calls' pieces released by this piece, in order
  };
  explicit ToolCallParser(const ToolCallFormat& format);
  Delta Add(std::string_view text);
  Delta Finish();
  /// Calls begun so far (the next call's index).
  int calls() const { return calls_; }

 private:
  // Where the text of a call region stands.
  enum class Part {
    kArrayOpen,  // Mistral: before the array's '['
    kHeader,     // before a call's arguments: `{"name": "...", "arguments": ` not yet all seen
    kArguments,  // inside the arguments' JSON object, released as it comes
    kTail,       // after the arguments: the call's '}' and the format's framing
    kWhole,      // a call not written name first: held until it ends, then parsed whole
  };
  // Moves what buffer_ settles into `out`; `final`: no more text follows.
  void Drain(bool final, Delta* out);
  // Drains inside a call region; returns whether the region ended (buffer_ holds what follows).
  bool DrainCall(bool final, Delta* out);
  // Parses `text` (a call, or the array of calls) into out->calls; false if it is not well-formed.
  bool ParseCalls(std::string_view text, Delta* out);
  // kTail of a named call (DeepSeek): its `call_close`, then the next call or the calls' `close`.
  // -1: more text is needed; 0: the region ended (buffer_ holds what follows); 1: a call follows.
  int NamedTail(bool final);
  // Ends the region: its unparsed text becomes content, the parser returns to content.
  void LeaveCall(Delta* out);

  const ToolCallFormat* format_;
  std::string buffer_;    // text not yet released
  bool in_call_ = false;  // buffer_ follows an opening (`open`, or a llama3_json reply's start)
  bool decided_ = false;  // llama3_json: whether the reply is a call has been decided
  Part part_ = Part::kHeader;
  std::string region_;    // kWhole: the region's text so far, `open` included (content if it fails)
  ToolCall current_;      // kArguments / kTail: the call being streamed
  int depth_ = 0;         // kArguments: nesting depth of the arguments' JSON
  bool in_string_ = false, escape_ = false;  // kArguments: inside a JSON string, after a backslash
  bool closed_brace_ = false;  // kTail: the call object's '}' has been seen
  bool streamed_any_ = false;  // Mistral: a call of the array has been streamed
  int calls_ = 0;
  std::vector<std::string> preserved_;  // format_->preserved: never content
  // Appends `text` to out->content without the preserved texts in it.
  void AddContent(std::string_view text, Delta* out) const;
};

/// A reply's text split at once: content and calls (ToolCallParser on the whole text).
ToolCallParser::Delta ParseToolCalls(const ToolCallFormat& format, std::string_view text);

/// A chat reply split as it streams into its reasoning, its content and its tool calls: the
/// ReasoningParser first, then the ToolCallParser on the answer only (a call the model thinks
/// about is not a call). Surfaces (kvq serve, kvq chat) split replies with this.
class ReplyParser {
 public:
  struct Delta {
    std::string reasoning;
    std::string content;
    std::vector<ToolCall> calls;
    std::vector<ToolCallChunk> chunks;
    bool empty() const { return reasoning.empty() && content.empty() && calls.empty() && chunks.empty(); }
  };
  /// `calls`: the format to find calls in, or nullptr (no calls: the answer is all content).
  ReplyParser(ReasoningFormat reasoning, bool starts_thinking, const ToolCallFormat* calls);
  Delta Add(std::string_view text);
  Delta Finish();
  /// Calls begun so far.
  int calls() const { return calls_ ? calls_->calls() : 0; }

 private:
  Delta Split(ReasoningParser::Delta r, bool final);
  ReasoningParser reasoning_;
  std::optional<ToolCallParser> calls_;
};

/// A whole reply split at once (ReplyParser on the whole text).
ReplyParser::Delta SplitReply(ReasoningFormat reasoning, bool starts_thinking, const ToolCallFormat* calls,
                              std::string_view text);

/// A fresh call id in `format`'s style.
std::string NewToolCallId(const ToolCallFormat& format);

}  // namespace kvq
