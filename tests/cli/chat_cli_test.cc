// `kvq chat` end to end, driven through stdin: on a tiny synth Qwen 3 carrying Qwen 3's vocabulary
// and chat template, three turns whose rendered prompts are byte for byte what @huggingface/jinja
// renders for the same conversations (tests/text/chat_template_oracle.js, run here on them), each
// turn prefilling only what the session did not hold; /save then /load in a new process continues
// with the same greedy reply (tool calls: chat_tools_cli_test.cc); `kvq run -f FILE` and `-p -`
// equal `-p TEXT`; `kvq run -cnv` chats;
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

#include "cli/chat_cli_util.h"
#include "kvq/model.h"
#include "test_util/run_kvq.h"

namespace {

using kvq_test::KvqRun;
using kvq_test::RunKvq;
using namespace kvq_test::chat;

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
