// `kvq chat`: a multi-turn conversation with a model through its chat template, as a client of the
// public API (Model::ApplyChatTemplate, Session::Generate, Truncate, SavePrefix/LoadPrefix). The
// conversation stays in the session's KV cache between turns (chat_conversation.h), so each turn
// prefills only its new tokens. Slash commands: /clear, /save FILE, /load FILE, /tool ID-or-NAME
// RESULT (answers a call the last reply made; once every call has its result the model goes on),
// /exit.
#include "cli/cmd_chat.h"

#include <fmt/core.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string_view>
#include <utility>

#include "cli/chat_conversation.h"
#include "cli/commands.h"
#include "cli/hub_flag.h"
#include "cli/run_report.h"
#include "kvq/reasoning.h"
#include "kvq/tool_calls.h"

namespace kvq::cli {
namespace {

constexpr const char* kCommands = "/clear, /save FILE, /load FILE, /tool ID-or-NAME RESULT, /exit";

// A slash command's outcome: go on, end the chat, or end it as bad input.
enum class Next { kContinue, kExit, kBadInput };

Next RunCommand(const std::string& line, ChatConversation& chat, const std::string& command, bool interactive) {
  const size_t space = line.find(' ');
  const std::string name = line.substr(0, space);
  std::string arg = space == std::string::npos ? "" : line.substr(space + 1);
  arg.erase(0, arg.find_first_not_of(' '));
  arg.erase(arg.find_last_not_of(' ') + 1);
  auto fail = [&](const std::string& message) {
    fmt::print(stderr, "kvq {}: error: {}\n", command, message);
    return interactive ? Next::kContinue : Next::kBadInput;
  };
  if (name == "/exit" || name == "/quit") return Next::kExit;
  if (name == "/clear") {
    if (Status s = chat.Clear(); !s.ok()) return fail("/clear: " + s.message());
    fmt::print(stderr, "kvq {}: conversation cleared\n", command);
    return Next::kContinue;
  }
  if (name == "/save" || name == "/load") {
    if (arg.empty()) return fail(name + " needs a FILE (" + name + " FILE)");
    if (name == "/save") {
      if (Status s = chat.Save(arg); !s.ok()) return fail("/save " + s.message());
      fmt::print(stderr, "kvq {}: saved {} messages to {} and the KV cache to {}\n", command,
                 chat.messages().size(), arg, ChatConversation::SnapshotPath(arg));
      return Next::kContinue;
    }
    std::string note;
    if (Status s = chat.Load(arg, &note); !s.ok()) return fail("/load " + s.message());
    fmt::print(stderr, "kvq {}: loaded {} messages from {}{}\n", command, chat.messages().size(), arg,
               note.empty() ? " with their KV cache" : "; " + note);
    return Next::kContinue;
  }
  return fail(fmt::format("unknown command '{}' (commands: {})", name, kCommands));
}

// The calls a reply made, as JSON objects ({id, name, arguments}).
nlohmann::json CallsJson(const std::vector<ToolCall>& calls) {
  nlohmann::json out = nlohmann::json::array();
  for (const ToolCall& c : calls) out.push_back({{"id", c.id}, {"name", c.name}, {"arguments", c.arguments}});
  return out;
}

// The `tool` message answering one of `pending` (the last reply's calls not yet answered), named by
// the call's id or, failing that, its function's name (the first such call). `arg` is "ID-or-NAME
// RESULT"; RESULT (JSON or text) is the message's content as typed.
Result<ChatMessage> ToolResult(std::string_view arg, const std::vector<ToolCall>& pending) {
  arg.remove_prefix(std::min(arg.size(), arg.find_first_not_of(' ')));
  const std::string key(arg.substr(0, arg.find(' ')));
  arg.remove_prefix(key.size());
  arg.remove_prefix(std::min(arg.size(), arg.find_first_not_of(' ')));
  const std::string result(arg);
  if (pending.empty()) return Status::Error("/tool: no call awaits a result (the last reply made none, or all are answered)");
  std::string names;
  for (const ToolCall& c : pending) names += fmt::format("{}{} ({})", names.empty() ? "" : ", ", c.id, c.name);
  if (key.empty() || result.empty()) {
    return Status::Error(fmt::format("/tool needs a call's id or name and its result (/tool ID-or-NAME RESULT); "
                                     "awaiting: {}", names));
  }
  auto call = std::find_if(pending.begin(), pending.end(), [&](const ToolCall& c) { return c.id == key; });
  if (call == pending.end()) {
    call = std::find_if(pending.begin(), pending.end(), [&](const ToolCall& c) { return c.name == key; });
  }
  if (call == pending.end()) {
    return Status::Error(fmt::format("/tool {}: no call awaiting a result has that id or name; awaiting: {}", key,
                                     names));
  }
  return ChatMessage{.role = "tool", .content = result, .tool_call_id = call->id, .name = call->name};
}

void PrintTurn(const ChatTurn& t, const std::string& user, int turn, bool json, const std::string& command,
               const std::vector<ToolCall>& calls, const std::string& reasoning,
               const std::vector<ChatMessage>& tool_results, const std::string& content) {
  const Completion& c = t.completion;
  const double prompt_tps = c.prompt_seconds > 0 ? t.prefilled / c.prompt_seconds : 0;
  const double decode_tps = c.decode_seconds > 0 ? static_cast<double>(c.tokens.size()) / c.decode_seconds : 0;
  if (t.dropped_messages > 0) {
    fmt::print(stderr, "kvq {}: the conversation would overflow the context; dropped its {} oldest messages\n",
               command, t.dropped_messages);
  }
  if (json) {
    nlohmann::json doc = {{"turn", turn}, {"user", user}, {"reply", t.reply}, {"prompt", t.prompt},
                                {"prompt_ids", t.prompt_ids}, {"reply_ids", c.tokens},
                                {"prompt_tokens", c.n_prompt}, {"prefilled", t.prefilled}, {"reused", c.n_reused},
                                {"dropped_messages", t.dropped_messages}, {"positions", t.positions},
                                {"generated", c.tokens.size()}, {"prompt_tps", prompt_tps},
                                {"decode_tps", decode_tps}, {"finish_reason", FinishReasonName(c.finish)},
                                {"tool_calls", CallsJson(calls)}, {"reasoning", reasoning},
                                {"content", content}, {"tool_results", nlohmann::json::array()}};
    for (const ChatMessage& m : tool_results) {
      doc["tool_results"].push_back({{"tool_call_id", m.tool_call_id}, {"name", m.name}, {"content", m.content}});
    }
    fmt::print("{}\n", doc.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
    std::fflush(stdout);
  }
  fmt::print(stderr, "kvq {}: turn {}: prompt {} tokens ({} prefilled, {} reused) at {:.1f} tok/s; reply {} "
             "tokens at {:.1f} tok/s; finish: {}\n", command, turn, c.n_prompt, t.prefilled, c.n_reused, prompt_tps,
             c.tokens.size(), decode_tps, FinishReasonName(c.finish));
}

}  // namespace

int RunChat(const ChatFlags& o, const std::string& command) {
  auto bad = [&](const std::string& m) { return BadInput(command, m); };
  ChatTemplateOptions render{.add_generation_prompt = true};
  if (!o.chat_template_file.empty()) {
    Result<std::string> source = ReadChatTemplateFile("--chat-template", o.chat_template_file);
    if (!source.ok()) return bad(source.status().message());
    render.template_override = std::move(source).value();
  }

  std::ifstream file;
  if (!o.input_file.empty()) {
    file.open(o.input_file, std::ios::binary);
    if (!file) return bad(fmt::format("-f {}: cannot read the file", o.input_file));
  }
  std::istream& input = o.input_file.empty() ? std::cin : file;
  ToolOptions tools;
  if (!o.tools_file.empty()) {
    std::ifstream in(o.tools_file, std::ios::binary);
    if (!in) return bad(fmt::format("--tools {}: cannot read the file", o.tools_file));
    std::stringstream text;
    text << in.rdbuf();
    tools.tools_json = text.str();
    if (o.tool_choice == "auto" || o.tool_choice == "none" || o.tool_choice == "required") {
      tools.choice = o.tool_choice == "auto" ? ToolChoice::kAuto
                     : o.tool_choice == "none" ? ToolChoice::kNone : ToolChoice::kRequired;
    } else {
      tools.choice = ToolChoice::kFunction;
      tools.function = o.tool_choice;
    }
    if (Result<std::vector<std::string>> names = CheckTools(tools); !names.ok()) {
      return bad(fmt::format("--tools {}: {}", o.tools_file, names.status().message()));
    }
    render.tools_json = tools.tools_json;
  } else if (o.tool_choice != "auto") {
    return bad("--tool-choice needs --tools FILE");
  }
  const bool interactive = o.input_file.empty() && isatty(STDIN_FILENO);
  Result<ReasoningFormat> reasoning_format = ParseReasoningFormat(o.reasoning_format);
  if (!reasoning_format.ok()) return bad("--reasoning-format: " + reasoning_format.status().message());

  Result<std::string> grammar = o.gen.Grammar();
  if (!grammar.ok()) return bad(grammar.status().message());
  Result<ModelSession> loaded = LoadModelSession(o.gen);
  if (!loaded.ok()) return bad(loaded.status().message());
  const Model& model = *loaded->model;
  Session& session = *loaded->session;
  if (!o.gen.quiet) fmt::print(stderr, "{}", ModelBanner(command, model, session, o.gen.shared.KvFormatName()));
  // Whether the template opens the model's thoughts in the prompt (DeepSeek R1's does): the reply
  // then starts inside them.
  const std::vector<ChatMessage> probe_chat = {{.role = "user", .content = "x"}};
  Result<std::string> probe = model.ApplyChatTemplate(probe_chat, render);
  const bool starts_thinking = probe.ok() && PromptOpensThinking(*probe);
  // Tools: the template's format decides the grammar of a forced call and how replies are split.
  const ToolCallFormat& tool_format = ToolCallFormatOf(model, render.template_override);
  const bool parse_calls = !tools.tools_json.empty() && tools.choice != ToolChoice::kNone;
  if (!tools.tools_json.empty()) {
    if (Status s = CheckToolCallTemplate(model, render.template_override); !s.ok()) {
      return bad(fmt::format("--tools {}: {}", o.tools_file, s.message()));
    }
    tools.starts_thinking = *reasoning_format != ReasoningFormat::kNone && starts_thinking;
    Result<std::string> forced = ToolCallGrammar(tool_format, tools);
    if (!forced.ok()) return bad(fmt::format("--tools {}: {}", o.tools_file, forced.status().message()));
    const bool forcing = tools.choice == ToolChoice::kRequired || tools.choice == ToolChoice::kFunction;
    if (forcing && !grammar->empty()) {
      return bad("--tool-choice " + o.tool_choice + " forces a call with its own grammar: drop --grammar/--json-schema");
    }
    // auto: the lazy grammar (free text, then only declared calls), unless --grammar constrains the reply.
    if (!forced->empty() && grammar->empty()) grammar = std::move(forced);
  }
  if (render.template_override.empty() && model.chat_template_choice().chatml_fallback) {
    fmt::print(stderr, "kvq {}: {}\n", command,
               model.info().chat_template.empty() ? "no chat template in the model; using ChatML"
                                                  : "using " + model.chat_template_choice().origin);
  }
  if (interactive) {
    fmt::print(stderr, "kvq {}: {} ({} positions); commands: {}; Ctrl-C stops a reply\n", command,
               o.gen.shared.ModelPath(), session.context(), kCommands);
  }
  ChatConversation chat(model, session, render, o.system_prompt, o.gen.n);
  // Each reply streams through a parser that splits thoughts from the answer (and calls from it);
  // thoughts are shown dimmed on a terminal, else between "[thinking]" and "[/thinking]" lines.
  const bool dim = isatty(STDOUT_FILENO) != 0;
  std::optional<ReplyParser> parser;
  ReplyParser::Delta split;  // the reply so far, split
  bool in_thought = false;
  auto show = [&](const ReplyParser::Delta& d) {
    split.reasoning += d.reasoning;
    split.content += d.content;
    split.calls.insert(split.calls.end(), d.calls.begin(), d.calls.end());
    if (o.gen.shared.json) return;
    if (!d.reasoning.empty()) {
      if (!in_thought) fmt::print("{}", dim ? "\x1b[2m" : "[thinking]\n");
      in_thought = true;
      fmt::print("{}", d.reasoning);
    }
    if (!d.content.empty() && in_thought) {
      fmt::print("{}", dim ? "\x1b[0m\n" : "\n[/thinking]\n");
      in_thought = false;
    }
    fmt::print("{}", d.content);
    std::fflush(stdout);
  };
  // A long turn (a pasted document, a loaded history) shows its prompt's progress.
  PromptProgress progress(command, isatty(STDERR_FILENO) != 0);
  const GenerateRequest request{
      .max_tokens = o.gen.n, .sampling = o.gen.Sampling(), .stop = o.gen.stop, .grammar = *grammar,
      // The format's control-token openings reach the parser as text (and the grammar can ask for them).
      .preserved_tokens = parse_calls ? PreservedTokens(tool_format) : std::vector<std::string>{},
      .speculation = loaded->speculation,
      .on_prompt_progress = [&](int64_t held, int64_t total) {
        if (o.gen.quiet) return;
        progress.Update(held, total);
        if (held == total) progress.Finish();
      }};
  session.SetAbortCallback([] { return g_interrupted.load(); });
  auto stream = [&](int32_t, const std::string& text) {
    show(parser->Add(text));
    return true;
  };
  int turn = 0;
  // Results given by /tool for the last reply's calls, sent with the last of them (or with the next
  // user message, which then follows them).
  std::vector<ChatMessage> results;
  // One turn: `added` goes into the conversation and the model replies. False: kvq is to exit 1.
  auto reply = [&](std::vector<ChatMessage> added, const std::string& line) {
    const InterruptScope interrupt_scope;  // Ctrl-C from here on stops the reply, not kvq
    parser.emplace(*reasoning_format, starts_thinking, parse_calls ? &tool_format : nullptr);
    split = {};
    in_thought = false;
    const std::vector<ChatMessage> tool_results(added.begin(), added.end() - (added.back().role == "user" ? 1 : 0));
    Result<ChatTurn> t = chat.Reply(std::move(added), request, stream);
    progress.Finish();  // a prompt stopped by Ctrl-C leaves no bar behind
    if (!t.ok()) {
      fmt::print(stderr, "kvq {}: error: {}\n", command, t.status().message());
      return interactive;
    }
    // The reply as the parser split it while it streamed; the calls are kept in the conversation.
    show(parser->Finish());
    if (in_thought && !o.gen.shared.json) fmt::print("{}", dim ? "\x1b[0m" : "\n[/thinking]");
    const std::vector<ToolCall> calls = split.calls;
    if (!calls.empty()) chat.SetLastReplyCalls(split.content, calls);
    if (!o.gen.shared.json) {
      fmt::print("\n");
      for (const ToolCall& c : calls) fmt::print("[tool call {}: {}({})]\n", c.id, c.name, c.arguments);
      std::fflush(stdout);
    }
    const std::string content =
        !chat.messages().empty() && chat.messages().back().role == "assistant" ? chat.messages().back().content : "";
    PrintTurn(*t, line, ++turn, o.gen.shared.json, command, calls, split.reasoning, tool_results, content);
    return true;
  };
  std::string line;
  while (true) {
    if (interactive) {
      fmt::print("> ");
      std::fflush(stdout);
    }
    if (!std::getline(input, line)) break;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    if (line.rfind("/tool ", 0) == 0 || line == "/tool") {
      // The calls still awaiting a result: the last reply's, less those answered since.
      std::vector<ToolCall> pending;
      for (const ToolCall& c : chat.PendingCalls()) {
        if (std::none_of(results.begin(), results.end(), [&](const ChatMessage& m) { return m.tool_call_id == c.id; })) {
          pending.push_back(c);
        }
      }
      Result<ChatMessage> result = ToolResult(line.substr(std::min<size_t>(line.size(), 6)), pending);
      if (!result.ok()) {
        fmt::print(stderr, "kvq {}: error: {}\n", command, result.status().message());
        if (!interactive) return kExitBadInput;
        continue;
      }
      results.push_back(std::move(result).value());
      if (pending.size() > 1) {
        fmt::print(stderr, "kvq {}: result for {} kept; {} more calls await results\n", command,
                   results.back().tool_call_id, pending.size() - 1);
        continue;
      }
      if (!reply(std::exchange(results, {}), "")) return 1;
      continue;
    }
    if (line[0] == '/') {
      const Next next = RunCommand(line, chat, command, interactive);
      if (next == Next::kExit) break;
      if (next == Next::kBadInput) return kExitBadInput;
      if (line.rfind("/clear", 0) == 0 || line.rfind("/load", 0) == 0) results.clear();
      continue;
    }
    std::vector<ChatMessage> added = std::exchange(results, {});
    added.push_back({.role = "user", .content = line});
    if (!reply(std::move(added), line)) return 1;
  }
  if (interactive) fmt::print("\n");
  return 0;
}

void AddChatCommand(CLI::App& app, int* exit_code) {
  auto o = std::make_shared<ChatFlags>();
  o->gen.n = -1;  // a reply ends at the model's end-of-turn token
  CLI::App* cmd = app.add_subcommand(
      "chat",
      "Chat with a model through its chat template (multi-turn; the conversation stays in the KV cache, so each "
      "turn prefills only its new tokens). Reads one message per line from the terminal, from stdin when it is "
      "not a terminal, or from -f FILE. Commands: /clear (forget the conversation), /save FILE (the conversation "
      "as JSON, and its KV cache in FILE.kv), /load FILE, /tool ID-or-NAME RESULT (the result of a call the last "
      "reply made, named by its id or its function's name; once every call has one, the model goes on), /exit. Ctrl-C stops a reply. When the context would "
      "overflow, the oldest messages (after the system prompt) are dropped and the stats say so.");
  cmd->footer(
      "Examples:\n"
      "  kvq chat -m MODEL.gguf -sys \"You are terse.\" --kv int8\n"
      "  echo \"What is a KV cache?\" | kvq chat -m MODEL.gguf --temp 0 --json\n"
      "  kvq run -cnv -m MODEL.gguf -p \"You are terse.\"     (llama.cpp's spelling: -p is the system message)\n"
      "Each turn prints a stats line on stderr: prompt tokens prefilled and reused, reply tokens, tok/s.");
  AddGenerateFlags(cmd, &o->gen);
  cmd->add_option("--system-prompt", o->system_prompt, "System message opening the conversation (also -sys)");
  cmd->add_option("--chat-template", o->chat_template_file,
                  "Jinja chat template FILE to use instead of the model's (default: the model's "
                  "tokenizer.chat_template, or ChatML when it has none)")
      ->type_name("FILE");
  cmd->add_option("--tools", o->tools_file,
                  "JSON FILE holding an array of OpenAI tool definitions ({\"type\": \"function\", \"function\": "
                  "{name, description, parameters}}) shown to the model through its template; the calls a reply "
                  "makes are printed (and kept in the conversation as calls); answer them with /tool")
      ->type_name("FILE");
  cmd->add_option("--tool-choice", o->tool_choice,
                  "auto (the model decides), none (no calls), required (a call is forced by a grammar), or a "
                  "function's name (that call is forced)")
      ->type_name("CHOICE")->default_str("auto");
  cmd->add_option("--reasoning-format", o->reasoning_format,
                  "How a reply's thoughts (<think>...</think>) are shown: 'deepseek' (or 'auto') apart from the "
                  "answer (dimmed on a terminal, else between [thinking] lines; --json: the turn's 'reasoning'), "
                  "'none' as part of the reply")
      ->capture_default_str()->type_name("FORMAT");
  cmd->add_option("-f,--file", o->input_file, "Read the user messages from FILE, one per line (slash commands too)")
      ->type_name("FILE");
  AddJsonFlag(cmd, &o->gen.shared,
              "Print one JSON object per turn (reply, rendered prompt and its ids, prefilled/reused counts, "
                "speeds) instead of streaming text");
  cmd->callback([o, exit_code] {
    if (*exit_code = ResolveModelFlag("chat", &o->gen.shared); *exit_code == 0) *exit_code = RunChat(*o, "chat");
  });
}

}  // namespace kvq::cli
