// `kvq chat --tools` end to end on the tiny synth Qwen 3 of chat_cli_util.h: a forced call is
// printed and kept as a call; /tool answers calls (by id, or by function name) and the prompt of
// the turn that follows is byte for byte @huggingface/jinja's rendering of the same messages and
// tools, prefilling only what the session did not hold; /save and /load keep calls and results;
// a template in DeepSeek's call format gets no tools.
// And `kvq bench grammar --tool-calls` on the same vocabulary: the lazy tool grammar's masks,
// before and after the call's opening.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <optional>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "cli/chat_cli_util.h"
#include "kvq/model.h"
#include "test_util/run_kvq.h"

namespace {

using kvq_test::KvqRun;
using kvq_test::RunKvq;
using namespace kvq_test::chat;

// --tools with a forced call: the random-weight model's reply is a call of the declared function
// (the grammar), printed in the turn's JSON, and kept as a call: the next turn's prompt renders it
// as Qwen 3's template writes calls. Bad tool files are refused naming the flag.
TEST_F(ChatCli, ToolsForcedCallIsPrintedAndKeptAsACall) {
  const std::string tools = WriteFile("tools.json", R"([{"type": "function", "function": {"name": "get_weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
                     "required": ["city"]}}}])");
  const std::string input = WriteFile("tools_stdin.txt", "Weather in Paris?\nAnd Oslo?\n");
  const KvqRun r = RunKvq("chat -m " + *model_ + " --temp 0 -n 300 -t 2 --json --tools " + tools +
                          " --tool-choice required < " + input);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::vector<json> turns = Turns(r.out);
  ASSERT_EQ(turns.size(), 2u) << r.out;
  ASSERT_GE(turns[0]["tool_calls"].size(), 1u) << turns[0].dump();
  const json call = turns[0]["tool_calls"][0];
  EXPECT_EQ(call["name"], "get_weather");
  const json args = json::parse(call["arguments"].get<std::string>());
  EXPECT_TRUE(args["city"] == "Paris" || args["city"] == "Oslo") << args.dump();
  const std::string prompt2 = turns[1]["prompt"];
  EXPECT_NE(prompt2.find("# Tools\n"), std::string::npos);
  // The arguments are rendered by the template's tojson (Python's separators).
  EXPECT_NE(prompt2.find("<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"" +
                         args["city"].get<std::string>() + "\"}}\n</tool_call><|im_end|>"),
            std::string::npos) << prompt2;
  const std::string bad_tools = WriteFile("bad_tools.json", R"([{"type": "function", "function": {}}])");
  const KvqRun bad = RunKvq("chat -m " + *model_ + " --tools " + bad_tools + " < " + input);
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("--tools " + bad_tools + ": tools[0].function.name must be a non-empty string"),
            std::string::npos) << bad.err;
  const KvqRun undeclared = RunKvq("chat -m " + *model_ + " --tools " + tools + " --tool-choice get_time < " + input);
  EXPECT_EQ(undeclared.exit_code, 2);
  EXPECT_NE(undeclared.err.find("'get_time', which tools does not declare"), std::string::npos) << undeclared.err;
}

// A `kvq chat` the test talks to as a user would: a line written, the turn it ran read back (--json
// prints one line per turn), so a later line can name what an earlier reply made (a call's id).
class ChatProcess {
 public:
  explicit ChatProcess(const std::vector<std::string>& args) {
    int in[2], out[2], err[2];
    if (pipe(in) != 0 || pipe(out) != 0 || pipe(err) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      dup2(in[0], STDIN_FILENO);
      dup2(out[1], STDOUT_FILENO);
      dup2(err[1], STDERR_FILENO);
      for (int fd : {in[0], in[1], out[0], out[1], err[0], err[1]}) close(fd);
      std::vector<char*> argv = {const_cast<char*>(KVQ_BINARY), const_cast<char*>("chat")};
      for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      execv(KVQ_BINARY, argv.data());
      _exit(127);
    }
    close(in[0]);
    close(out[1]);
    close(err[1]);
    in_ = in[1];
    out_ = out[0];
    err_ = err[0];
  }
  // Sends `line`, which runs no turn.
  bool Write(const std::string& line) {
    const std::string text = line + "\n";
    return write(in_, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  }
  // Sends `line` and returns the turn it ran (null when kvq printed none and ended).
  json Send(const std::string& line) {
    if (!Write(line)) return nullptr;
    char buf[4096];
    size_t end;
    while ((end = pending_.find('\n')) == std::string::npos) {
      const ssize_t n = read(out_, buf, sizeof(buf));
      if (n <= 0) return nullptr;
      pending_.append(buf, static_cast<size_t>(n));
    }
    const json turn = json::parse(pending_.substr(0, end));
    pending_.erase(0, end + 1);
    return turn;
  }
  // Ends the input; kvq's exit code, its stderr in `err`.
  int Finish(std::string* err) {
    close(in_);
    char buf[4096];
    for (ssize_t n; (n = read(out_, buf, sizeof(buf))) > 0;) pending_.append(buf, static_cast<size_t>(n));
    for (ssize_t n; (n = read(err_, buf, sizeof(buf))) > 0;) err->append(buf, static_cast<size_t>(n));
    close(out_);
    close(err_);
    int status = 0;
    if (waitpid(pid_, &status, 0) != pid_ || !WIFEXITED(status)) return -1;
    return WEXITSTATUS(status);
  }

 private:
  pid_t pid_ = -1;
  int in_ = -1, out_ = -1, err_ = -1;
  std::string pending_;  // stdout read past the last turn
};

// Keys in sorted order: the oracle's cases are written by nlohmann::json, which sorts them, and the
// template prints the tools in the order it gets them.
const char* kWeatherTools = R"([{"function": {"name": "get_weather",
    "parameters": {"properties": {"city": {"enum": ["Paris", "Oslo"], "type": "string"}},
                   "required": ["city"], "type": "object"}}, "type": "function"}])";

// The assistant message a tool-calling turn left in the conversation, as OpenAI writes it (the
// arguments as an object: kvq hands the template parsed arguments, as the test's tojson check shows).
json AssistantWithCalls(const json& turn) {
  json calls = json::array();
  for (const json& c : turn["tool_calls"]) {
    calls.push_back({{"id", c["id"]}, {"type", "function"},
                     {"function", {{"name", c["name"]}, {"arguments", json::parse(c["arguments"].get<std::string>())}}}});
  }
  return {{"role", "assistant"}, {"content", turn["content"]}, {"tool_calls", calls}};
}

// /tool answers each call by its id (the random model makes several, in parallel): with the last
// result the model goes on from the conversation with one `role: tool` message per call, and the
// prompt rendered for that turn is byte for byte the oracle's rendering of the same messages with
// the same tools; only the tokens the session did not hold are prefilled.
TEST_F(ChatCli, ToolResultByIdContinuesAsTheOracleRendersIt) {
  const std::string tools = WriteFile("result_tools.json", kWeatherTools);
  ChatProcess chat({"-m", *model_, "--temp", "0", "-n", "300", "-t", "2", "--json", "--tools", tools,
                    "--tool-choice", "required"});
  const json turn1 = chat.Send("Weather in Paris?");
  ASSERT_TRUE(turn1.is_object());
  const size_t n_calls = turn1["tool_calls"].size();
  ASSERT_GE(n_calls, 1u) << turn1.dump();
  // The results, answered in the reverse of the calls' order: the messages follow the answers.
  const json user = {{"role", "user"}, {"content", "Weather in Paris?"}};
  json messages = json::array({user, AssistantWithCalls(turn1)});
  json turn2;
  for (size_t k = n_calls; k-- > 0;) {
    const std::string id = turn1["tool_calls"][k]["id"];
    const std::string result = "{\"temperature\": " + std::to_string(20 + k) + ", \"sky\": \"clear\"}";
    messages.push_back({{"role", "tool"}, {"tool_call_id", id}, {"name", "get_weather"}, {"content", result}});
    if (k > 0) {
      ASSERT_TRUE(chat.Write("/tool " + id + " " + result));
    } else {
      turn2 = chat.Send("/tool " + id + " " + result);
    }
  }
  std::string err;
  ASSERT_EQ(chat.Finish(&err), 0) << err;
  ASSERT_TRUE(turn2.is_object()) << err;
  ASSERT_EQ(turn2["tool_results"].size(), n_calls);
  for (size_t k = 0; k < n_calls; ++k) {
    const json& m = messages[2 + k];
    EXPECT_EQ(turn2["tool_results"][k],
              json({{"tool_call_id", m["tool_call_id"]}, {"name", "get_weather"}, {"content", m["content"]}}));
  }
  const json conversations = {
      {"call", {{"messages", json::array({user})}, {"tools", json::parse(kWeatherTools)}}},
      {"result", {{"messages", messages}, {"tools", json::parse(kWeatherTools)}}}};
  kvq::Result<std::unique_ptr<kvq::Model>> model = kvq::Model::Load(*model_, {.threads = 1});
  ASSERT_TRUE(model.ok()) << model.status().message();
  const std::map<std::string, std::string> oracle = OracleRenders(conversations, (*model)->info().chat_template);
  EXPECT_EQ(turn1["prompt"].get<std::string>(), oracle.at("call"));
  const std::string& expected = oracle.at("result");
  EXPECT_EQ(turn2["prompt"].get<std::string>(), expected);
  EXPECT_NE(expected.find("<tool_response>\n" + messages[2]["content"].get<std::string>() + "\n</tool_response>"),
            std::string::npos) << expected;
  const std::vector<int32_t> prompt2 = turn2["prompt_ids"].get<std::vector<int32_t>>();
  EXPECT_EQ(prompt2, (*model)->TokenizeChatPrompt(expected));
  // What the session held after turn 1, and the part of turn 2's prompt it shares: exactly that is
  // reused and only the rest prefilled. (The template re-renders the calls with its own spacing, so
  // the random reply's text is shared only up to where its spacing first differs.)
  std::vector<int32_t> held = turn1["prompt_ids"].get<std::vector<int32_t>>();
  const std::vector<int32_t> reply1 = turn1["reply_ids"].get<std::vector<int32_t>>();
  held.insert(held.end(), reply1.begin(), reply1.end());
  held.resize(turn1["positions"].get<size_t>());
  size_t common = 0;
  while (common < held.size() && common < prompt2.size() && held[common] == prompt2[common]) ++common;
  EXPECT_GE(common, turn1["prompt_ids"].size() - 1) << "turn 2's prompt should extend turn 1's";
  EXPECT_EQ(turn2["reused"].get<size_t>(), std::min(common, prompt2.size() - 1));
  EXPECT_EQ(turn2["prefilled"].get<size_t>(), prompt2.size() - turn2["reused"].get<size_t>());
}

// /tool by the function's name, read from stdin, answers the first of the calls awaiting a result;
// a user message before the others are answered goes after the results given so far. /save keeps
// the calls and results, so a /load in a new process renders the next turn as the first process
// did. A /tool naming no awaited call, or sent when none awaits, is bad input naming those that do.
TEST_F(ChatCli, ToolResultByNameIsSavedAndLoaded) {
  const std::string tools = WriteFile("name_tools.json", kWeatherTools);
  const std::string saved = Stem() + "_tools_saved.json";
  auto chat = [&](const std::string& stdin_text) {
    return RunKvq("chat -m " + *model_ + " --temp 0 -n 300 -t 2 --json --tools " + tools +
                  " --tool-choice required < " + WriteFile("name_stdin.txt", stdin_text));
  };
  const KvqRun a = chat("Weather in Oslo?\n/tool get_weather 3 degrees, snow\nThanks.\n/save " + saved + "\nMore?\n");
  ASSERT_EQ(a.exit_code, 0) << a.err;
  const std::vector<json> ta = Turns(a.out);
  ASSERT_EQ(ta.size(), 3u) << a.out;
  ASSERT_GE(ta[0]["tool_calls"].size(), 2u) << "the case needs calls left unanswered";
  EXPECT_NE(a.err.find("more calls await results"), std::string::npos) << a.err;
  EXPECT_EQ(ta[1]["user"], "Thanks.");
  EXPECT_EQ(ta[1]["tool_results"],
            json::array({{{"tool_call_id", ta[0]["tool_calls"][0]["id"]}, {"name", "get_weather"},
                          {"content", "3 degrees, snow"}}}));
  const KvqRun b = chat("/load " + saved + "\nMore?\n");
  ASSERT_EQ(b.exit_code, 0) << b.err;
  const std::vector<json> tb = Turns(b.out);
  ASSERT_EQ(tb.size(), 1u);
  EXPECT_EQ(tb[0]["prompt"], ta[2]["prompt"]);
  EXPECT_EQ(tb[0]["reused"], ta[2]["reused"]);
  fs::remove(saved);
  fs::remove(saved + ".kv");

  const KvqRun unknown = chat("Weather in Oslo?\n/tool get_time 12:00\n");
  EXPECT_EQ(unknown.exit_code, 2);
  const std::vector<json> tu = Turns(unknown.out);
  ASSERT_EQ(tu.size(), 1u) << unknown.out;
  EXPECT_NE(unknown.err.find("/tool get_time: no call awaiting a result has that id or name; awaiting: " +
                             tu[0]["tool_calls"][0]["id"].get<std::string>() + " (get_weather)"),
            std::string::npos) << unknown.err;
  const KvqRun none = chat("/tool get_weather 3 degrees\n");
  EXPECT_EQ(none.exit_code, 2);
  EXPECT_NE(none.err.find("/tool: no call awaits a result"), std::string::npos) << none.err;
}

// A DeepSeek template in a format other than V3's (the fragment below writes calls as V3.1's does,
// the name before the separator and bare JSON after it) gets no tools: kvq cannot force or parse
// those calls, so --tools is refused naming the format instead of asking in another, and kvq serve
// answers a request with tools 400 (param tools). V3's own template is supported (tool_calls_test).
TEST_F(ChatCli, ToolsWithDeepSeekV31TemplateAreRefusedNamingTheFormat) {
  const std::string tpl = WriteFile("deepseek.jinja",
      "{%- for message in messages %}{%- if message['role'] == 'user' %}{{'<｜User｜>' + message['content']}}"
      "{%- endif %}{%- if message['role'] == 'assistant' and message['content'] is none %}"
      "{%- for tool in message['tool_calls']%}{{'<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + "
      "tool['function']['name'] + '<｜tool▁sep｜>' + tool['function']['arguments']}}{%- endfor %}{%- endif %}"
      "{%- endfor %}"
      "{% if add_generation_prompt %}{{'<｜Assistant｜>'}}{% endif %}");
  const std::string tools = WriteFile("deepseek_tools.json", kWeatherTools);
  const std::string input = WriteFile("deepseek_stdin.txt", "Weather in Paris?\n");
  const KvqRun r = RunKvq("chat -m " + *model_ + " --chat-template " + tpl + " --tools " + tools + " < " + input);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--tools " + tools + ": the chat template writes tool calls in the 'deepseek' format (it "
                       "holds <｜tool▁calls▁begin｜>), which kvq does not support"),
            std::string::npos) << r.err;
  EXPECT_EQ(r.out, "");
  // Without tools the template chats.
  const KvqRun plain = RunKvq("chat -m " + *model_ + " --chat-template " + tpl + " --temp 0 -n 2 --json < " + input);
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  EXPECT_EQ(Turns(plain.out).at(0)["prompt"], "<｜User｜>Weather in Paris?<｜Assistant｜>");

  // The server: a request with tools is a 400 whose param is tools.
  const std::string log = Stem() + "_deepseek_serve.log";
  const pid_t server = fork();
  if (server == 0) {
    const std::string cmd = std::string("exec ") + KVQ_BINARY + " serve -m " + *model_ + " --chat-template " + tpl +
                            " --port 0 -t 1 --web '' 2>" + log;
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  static const std::regex listening("listening on http://127\\.0\\.0\\.1:(\\d+)");
  std::smatch m;
  std::string text;
  for (int i = 0; i < 600 && !std::regex_search(text, m, listening); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    text = kvq_test::Slurp(log);
  }
  std::optional<httplib::Result> reply;
  if (std::regex_search(text, m, listening)) {
    httplib::Client client("127.0.0.1", std::stoi(m[1]));
    client.set_read_timeout(std::chrono::seconds(60));
    const json body = {{"messages", json::array({{{"role", "user"}, {"content", "Weather in Paris?"}}})},
                       {"tools", json::parse(kWeatherTools)}, {"max_tokens", 2}};
    reply = client.Post("/v1/chat/completions", body.dump(), "application/json");
  }
  kill(server, SIGTERM);
  waitpid(server, nullptr, 0);
  ASSERT_TRUE(reply.has_value()) << text;
  ASSERT_TRUE(*reply);
  EXPECT_EQ((*reply)->status, 400) << (*reply)->body;
  const json error = json::parse((*reply)->body)["error"];
  EXPECT_EQ(error["param"], "tools");
  EXPECT_NE(error["message"].get<std::string>().find("in the 'deepseek' format"), std::string::npos) << error.dump();
}

// --tool-calls feeds its reply (a sentence, then a Hermes call) through the lazy grammar: every
// token is allowed (else exit 2 naming --reply), the masks of the tokens before the opening
// (<tool_call> is one token of Qwen 3's vocabulary) and after it add up to all masks, and a reply
// that opens no call, or a call the tools do not declare, is refused naming --reply.
TEST_F(ChatCli, BenchGrammarTimesTheLazyToolGrammarBeforeAndAfterTheOpening) {
  const KvqRun r = RunKvq("bench grammar -m " + *model_ + " -t 1 --tool-calls");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("grammar: tool_choice auto's lazy tool grammar, format hermes"), std::string::npos) << r.out;
  kvq::Result<std::unique_ptr<kvq::Model>> model = kvq::Model::Load(*model_, {.threads = 1});
  ASSERT_TRUE(model.ok()) << model.status().message();
  const std::string sentence = "I will look the weather up for you.\n";
  const size_t before = (*model)->Tokenize(sentence, kvq::AddBos::kNo).size() + 1;  // + the opening's own mask
  std::smatch total, free, call;
  ASSERT_TRUE(std::regex_search(r.out, total, std::regex("mask per token: .*\\(([0-9]+) masks\\)"))) << r.out;
  ASSERT_TRUE(std::regex_search(r.out, free, std::regex("mask before the opening: .*\\(([0-9]+) masks\\); mean / decode step [0-9.]+%")))
      << r.out;
  ASSERT_TRUE(std::regex_search(r.out, call, std::regex("mask after the opening : .*\\(([0-9]+) masks\\)"))) << r.out;
  EXPECT_EQ(std::stoul(free[1]), before) << r.out;
  EXPECT_EQ(std::stoul(free[1]) + std::stoul(call[1]), std::stoul(total[1])) << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex("generated [0-9]+ tokens \\(stop\\)"))) << r.out;  // the call closed

  const KvqRun no_call = RunKvq("bench grammar -m " + *model_ + " -t 1 --tool-calls --reply 'Just text.'");
  EXPECT_EQ(no_call.exit_code, 2);
  EXPECT_NE(no_call.err.find("--reply must open a call as the model's format (hermes) does: with '<tool_call>'"),
            std::string::npos) << no_call.err;
  const KvqRun undeclared = RunKvq("bench grammar -m " + *model_ + " -t 1 --tool-calls --reply '<tool_call>\n{\"name\": \"get_time\"'");
  EXPECT_EQ(undeclared.exit_code, 2);
  EXPECT_NE(undeclared.err.find("--reply: the grammar refuses its token"), std::string::npos) << undeclared.err;
}

}  // namespace
