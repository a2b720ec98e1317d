// `kvq bench grammar`: what constrained output costs per token. A completion is generated under a
// JSON-schema grammar; each step times Generator::Constrain (the allowed-token mask over the whole
// vocabulary, and -infinity written into the logits) apart from the decode step (Session::Decode),
// and prints both and their ratio. The vocabulary trie is built once per model, before the loop,
// and timed on its own line. With --tool-calls the grammar is instead tool_choice auto's lazy
// tool grammar (free text until the model's call opening, then only declared calls), and the reply
// is a fixed text that opens a call (a random-weight model would seldom write one), fed token by
// token through the same mask: the mask is timed before the opening and after it, apart.
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <vector>

#include "cli/commands.h"
#include "cli/flags.h"
#include "kvq/generator.h"
#include "kvq/model.h"
#include "kvq/session.h"
#include "kvq/tool_calls.h"

namespace kvq::cli {
namespace {

// The default schema: nested objects, an array, an enum, numbers and bounded strings.
constexpr const char* kDefaultSchema = R"({"type":"object","properties":{
  "name":{"type":"string","maxLength":24},"age":{"type":"integer"},"score":{"type":"number"},
  "role":{"enum":["admin","user","guest"]},
  "address":{"type":"object","properties":{"city":{"type":"string","maxLength":24},
    "zip":{"type":"string","maxLength":10}},"required":["city"]},
  "tags":{"type":"array","items":{"type":"string","maxLength":12},"maxItems":6}},
  "required":["name","age","role","address","tags"]})";

// --tool-calls' tools and reply: one function, and a sentence then a call of it in Qwen 3's
// (Hermes) format; another model's format needs --reply in its own spelling.
constexpr const char* kDefaultTools = R"([{"type": "function", "function": {"name": "get_weather",
  "description": "The weather in a city now", "parameters": {"type": "object", "properties": {
  "city": {"type": "string", "maxLength": 40}, "unit": {"enum": ["celsius", "fahrenheit"]}},
  "required": ["city"]}}}])";
constexpr const char* kDefaultReply = "I will look the weather up for you.\n<tool_call>\n{\"name\": \"get_weather\", "
                                      "\"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n</tool_call>";

struct BenchGrammarOptions {
  std::string model;
  SharedOptions repack;  // --repack, --repack-memory (its other fields unused here)
  std::string schema_file;  // empty: kDefaultSchema
  std::string prompt = "The user record as JSON:";
  int32_t tokens = 64;
  int32_t threads = 0;
  uint64_t seed = 1;
  bool tool_calls = false;   // the lazy tool grammar, on a fixed reply
  std::string tools_file;    // empty: kDefaultTools
  std::string reply = kDefaultReply;
};

using Clock = std::chrono::steady_clock;
double Ms(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); }

int RunBenchGrammar(const BenchGrammarOptions& o) {
  auto bad = [](const std::string& m) { return BadInput("bench grammar", m); };
  if (o.tokens < 1 || o.tokens > 100000) return bad(fmt::format("--tokens must be in 1..100000 (got {})", o.tokens));
  if (o.tool_calls && !o.schema_file.empty()) return bad("--tool-calls and --json-schema-file: choose one grammar");
  if (!o.tool_calls && (!o.tools_file.empty() || o.reply != kDefaultReply)) {
    return bad("--tools and --reply need --tool-calls");
  }
  std::string schema = kDefaultSchema;
  if (!o.schema_file.empty()) {
    std::ifstream in(o.schema_file, std::ios::binary);
    if (!in) return bad(fmt::format("--json-schema-file {}: cannot read the file", o.schema_file));
    schema.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  ToolOptions tools{.tools_json = kDefaultTools, .choice = ToolChoice::kAuto};
  if (!o.tools_file.empty()) {
    std::ifstream in(o.tools_file, std::ios::binary);
    if (!in) return bad(fmt::format("--tools {}: cannot read the file", o.tools_file));
    tools.tools_json.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  Result<std::string> grammar = o.tool_calls ? Result<std::string>(std::string()) : JsonSchemaGrammar(schema);
  if (!grammar.ok()) return bad("--json-schema-file: " + grammar.status().message());
  ModelOptions mo{.repack = o.repack.repack, .repack_memory_available = o.repack.repack_memory_available};
  if (o.threads > 0) mo.threads = o.threads;
  Result<std::unique_ptr<Model>> loaded = Model::Load(o.model, mo);
  if (!loaded.ok()) return bad(loaded.status().message());
  const Model& model = **loaded;
  const ToolCallFormat& format = ToolCallFormatOf(model);
  if (o.tool_calls) {
    if (Status s = CheckToolCallTemplate(model); !s.ok()) return bad("--tool-calls: " + s.message());
    grammar = ToolCallGrammar(format, tools);
    if (!grammar.ok()) return bad(fmt::format("--tools {}: {}", o.tools_file.empty() ? "(built-in)" : o.tools_file,
                                              grammar.status().message()));
  }
  // --tool-calls: the reply's tokens, fed in place of sampled ones.
  const std::vector<int32_t> script = o.tool_calls ? model.Tokenize(o.reply, AddBos::kNo) : std::vector<int32_t>{};
  if (o.tool_calls && o.reply.find(format.open) == std::string::npos) {
    return bad(fmt::format("--reply must open a call as the model's format ({}) does: with '{}'", format.name,
                           format.open));
  }
  Result<std::unique_ptr<Session>> made = model.NewSession();
  if (!made.ok()) return bad(made.status().message());
  Session& session = **made;
  session.SetSampler({.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f, .seed = o.seed});
  if (Status s = session.Prefill(model.Tokenize(o.prompt)); !s.ok()) return bad(s.message());
  const int32_t vocab = model.info().vocab_size;
  std::vector<float> logits(session.logits().begin(), session.logits().end());  // [vocab]

  // A forced call's control-token opening (Mistral's [TOOL_CALLS]) is the token, as in kvq serve.
  const std::vector<std::string> preserved =
      o.tool_calls ? PreservedTokens(format) : std::vector<std::string>{};
  // The trie: built by the first Constrain of any generator of this model.
  // --tool-calls runs the whole reply (and one step past it) whatever --tokens says.
  const int32_t max_tokens = o.tool_calls ? static_cast<int32_t>(script.size()) + 1 : o.tokens;
  Result<Generator> first = Generator::Create(
      session, {.max_tokens = max_tokens, .grammar = *grammar, .preserved_tokens = preserved});
  if (!first.ok()) return bad(first.status().message());
  const auto t_trie = Clock::now();
  first.value().Constrain(logits);
  const double trie_ms = Ms(t_trie, Clock::now());

  Result<Generator> made_g = Generator::Create(
      session, {.max_tokens = max_tokens, .grammar = *grammar, .preserved_tokens = preserved});
  if (!made_g.ok()) return bad(made_g.status().message());
  Generator& g = made_g.value();
  std::vector<double> mask_ms, decode_ms;
  std::vector<double> free_ms, call_ms;  // --tool-calls: masks before the call's opening, and from it
  while (!g.finished()) {
    logits.assign(session.logits().begin(), session.logits().end());
    const bool opened = o.tool_calls && g.text().find(format.open) != std::string::npos;
    const auto t0 = Clock::now();
    g.Constrain(logits);
    mask_ms.push_back(Ms(t0, Clock::now()));
    if (o.tool_calls) (opened ? call_ms : free_ms).push_back(mask_ms.back());
    Result<int32_t> token = 0;
    if (o.tool_calls) {
      if (g.tokens().size() >= script.size()) break;  // the reply is all fed
      token = script[g.tokens().size()];
      if (!std::isfinite(logits[static_cast<size_t>(*token)])) {
        return bad(fmt::format("--reply: the grammar refuses its token {} (id {}) after {}", g.tokens().size(),
                               *token, nlohmann::json(g.text()).dump(-1, ' ', false,
                                                                      nlohmann::json::error_handler_t::replace)));
      }
    } else {
      token = session.Sample(logits);
    }
    if (!token.ok()) return bad(token.status().message());
    const GeneratorStep step = g.Next(*token);
    if (!step.run) break;
    const auto t1 = Clock::now();
    if (Status s = session.Decode(*token); !s.ok()) return bad(s.message());
    decode_ms.push_back(Ms(t1, Clock::now()));
  }
  auto mean = [](const std::vector<double>& v) { return v.empty() ? 0.0 : std::accumulate(v.begin(), v.end(), 0.0) / v.size(); };
  auto median = [](std::vector<double> v) {
    if (v.empty()) return 0.0;
    std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
    return v[v.size() / 2];
  };
  const double mask_mean = mean(mask_ms), decode_mean = mean(decode_ms);
  fmt::print("model {}: vocabulary {} tokens, {} threads\n", o.model, vocab, model.info().threads);
  const std::string grammar_name =
      o.tool_calls ? fmt::format("tool_choice auto's lazy tool grammar, format {}, tools {}", format.name,
                                 o.tools_file.empty() ? "(built-in)" : o.tools_file)
      : o.schema_file.empty() ? "the default JSON schema" : o.schema_file;
  fmt::print("grammar: {} ({} bytes of GBNF)\n", grammar_name, grammar->size());
  const std::string shown = nlohmann::json(g.text().substr(0, 160)).dump(-1, ' ', false,
                                                                           nlohmann::json::error_handler_t::replace);
  fmt::print("generated {} tokens ({}), text {}{}\n", g.tokens().size(), FinishReasonName(g.finish_reason()), shown,
             g.text().size() > 160 ? " ..." : "");
  fmt::print("vocabulary trie (once per model):  {:8.2f} ms\n", trie_ms);
  fmt::print("mask per token:   mean {:8.3f} ms   median {:8.3f} ms   max {:8.3f} ms   ({} masks)\n", mask_mean,
             median(mask_ms), mask_ms.empty() ? 0.0 : *std::max_element(mask_ms.begin(), mask_ms.end()),
             mask_ms.size());
  fmt::print("decode step:      mean {:8.3f} ms   median {:8.3f} ms   ({} steps)\n", decode_mean, median(decode_ms),
             decode_ms.size());
  fmt::print("mask / decode step: {:.1f}% (mean), {:.1f}% (median)\n",
             decode_mean > 0 ? 100 * mask_mean / decode_mean : 0.0,
             median(decode_ms) > 0 ? 100 * median(mask_ms) / median(decode_ms) : 0.0);
  if (o.tool_calls) {
    for (const auto& [phase, v] : {std::pair{"before the opening", &free_ms}, std::pair{"after the opening ", &call_ms}}) {
      fmt::print("mask {}: mean {:8.3f} ms   median {:8.3f} ms   max {:8.3f} ms   ({} masks); mean / decode step "
                 "{:.1f}%\n", phase, mean(*v), median(*v), v->empty() ? 0.0 : *std::max_element(v->begin(), v->end()),
                 v->size(), decode_mean > 0 ? 100 * mean(*v) / decode_mean : 0.0);
    }
  }
  return 0;
}

}  // namespace

void AddBenchGrammarCommand(CLI::App& bench, int* exit_code) {
  auto o = std::make_shared<BenchGrammarOptions>();
  CLI::App* cmd = bench.add_subcommand("grammar", "Constrained output: the allowed-token mask's time per token "
                                                  "beside the decode step's, under a JSON-schema grammar");
  cmd->add_option("-m,--model", o->model, "Model file (GGUF)")->required()->type_name("FILE");
  AddRepackFlags(cmd, &o->repack);
  cmd->add_option("--json-schema-file", o->schema_file, "A JSON Schema (default: a built-in user-record schema)")
      ->check(CLI::ExistingFile)
      ->type_name("FILE");
  cmd->add_option("-p,--prompt", o->prompt, "Prompt")->capture_default_str();
  cmd->add_option("--tokens", o->tokens, "Tokens to generate at most")->capture_default_str();
  cmd->add_option("-t,--threads", o->threads, "Threads (default: the model's)");
  cmd->add_option("--seed", o->seed, "Sampling seed")->capture_default_str();
  cmd->add_flag("--tool-calls", o->tool_calls,
                "Time tool_choice auto's lazy tool grammar instead, on a fixed reply that opens a call (--reply), "
                "its masks before the call's opening and after it apart");
  cmd->add_option("--tools", o->tools_file, "With --tool-calls: a JSON FILE of OpenAI tool definitions "
                                            "(default: a built-in get_weather)")->type_name("FILE");
  cmd->add_option("--reply", o->reply, "With --tool-calls: the reply fed through the mask, in the model's call "
                                       "format (default: a sentence, then a Hermes <tool_call> of get_weather)");
  cmd->callback([o, exit_code] { *exit_code = RunBenchGrammar(*o); });
}

}  // namespace kvq::cli
