// The OpenAI wire format of kvq serve (src/server/openai_protocol.h): what a request may hold, the
// error each bad field gets (status, param, message), and the shapes of responses and stream
// chunks that OpenAI's clients parse.
#include "server/openai_protocol.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace kvq::server {
namespace {

using json = nlohmann::json;

const RequestLimits kLimits{.max_tokens_limit = 1000};

GenerationRequest Ok(Endpoint e, const std::string& body) {
  auto r = ParseGenerationRequest(e, body, kLimits);
  if (auto* err = std::get_if<ApiError>(&r)) ADD_FAILURE() << body << " → " << err->message;
  return std::holds_alternative<GenerationRequest>(r) ? std::get<GenerationRequest>(r) : GenerationRequest{};
}

ApiError Bad(Endpoint e, const std::string& body) {
  auto r = ParseGenerationRequest(e, body, kLimits);
  if (!std::holds_alternative<ApiError>(r)) ADD_FAILURE() << body << " was accepted";
  return std::holds_alternative<ApiError>(r) ? std::get<ApiError>(r) : ApiError{};
}

TEST(OpenAiProtocol, CompletionFieldsAndDefaults) {
  GenerationRequest r = Ok(Endpoint::kCompletions,
                           R"({"model":"m","prompt":"Hi","max_tokens":7,"temperature":0,"top_p":0.5,"top_k":3,
                               "min_p":0.1,"seed":-5,"stop":["\n","END"],"stream":true,
                               "stream_options":{"include_usage":true},"ignore_eos":true})");
  EXPECT_EQ(r.model, "m");
  EXPECT_EQ(r.prompt, "Hi");
  EXPECT_EQ(r.max_tokens, 7);
  EXPECT_EQ(r.sampling.temperature, 0.0f);
  EXPECT_EQ(r.sampling.top_p, 0.5f);
  EXPECT_EQ(r.sampling.top_k, 3);
  EXPECT_EQ(r.sampling.min_p, 0.1f);
  EXPECT_EQ(r.sampling.seed, static_cast<uint64_t>(int64_t{-5}));
  EXPECT_TRUE(r.seed_given);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"\n", "END"}));
  EXPECT_TRUE(r.stream && r.include_usage && r.ignore_eos);
  // Absent fields: kvq's sampler defaults (llama.cpp's), no max_tokens (until the end), a fresh seed.
  GenerationRequest d = Ok(Endpoint::kCompletions, R"({"prompt":["one prompt"]})");
  EXPECT_EQ(d.prompt, "one prompt");
  EXPECT_FALSE(d.max_tokens.has_value());
  EXPECT_EQ(d.sampling.temperature, SamplerOptions{}.temperature);
  EXPECT_EQ(d.sampling.top_k, SamplerOptions{}.top_k);
  EXPECT_FALSE(d.seed_given);
  EXPECT_FALSE(d.stream);
  // seed -1 is llama.cpp's "random", as kvq run's --seed -1; -2 is a seed like any other.
  GenerationRequest random = Ok(Endpoint::kCompletions, R"({"prompt":"x","seed":-1})");
  EXPECT_FALSE(random.seed_given);
  GenerationRequest minus_two = Ok(Endpoint::kCompletions, R"({"prompt":"x","seed":-2})");
  EXPECT_TRUE(minus_two.seed_given);
  EXPECT_EQ(minus_two.sampling.seed, ~uint64_t{1});
}

TEST(OpenAiProtocol, ChatMessagesAndContentParts) {
  GenerationRequest r = Ok(Endpoint::kChatCompletions,
                           R"({"messages":[{"role":"system","content":"Be brief."},
                                           {"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},
                                           {"role":"assistant","content":null}],
                               "max_completion_tokens":9,"chat_template_kwargs":{"enable_thinking":false}})");
  ASSERT_EQ(r.messages.size(), 3u);
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.messages[1].content, "a\nb");
  EXPECT_EQ(r.messages[2].content, "");
  EXPECT_EQ(r.max_tokens, 9);
  EXPECT_EQ(r.enable_thinking, false);
}

TEST(OpenAiProtocol, EveryBadFieldIsA400NamingIt) {
  struct Case {
    Endpoint endpoint;
    const char* body;
    const char* param;
    const char* says;
  };
  const Endpoint C = Endpoint::kCompletions, H = Endpoint::kChatCompletions;
  const Case cases[] = {
      {C, "{not json", "", "not valid JSON"},
      {C, "[1,2]", "", "must be a JSON object"},
      {C, R"({})", "prompt", "'prompt' is required"},
      {C, R"({"prompt":5})", "prompt", "must be a string"},
      {C, R"({"prompt":""})", "prompt", "must not be empty"},
      {C, R"({"prompt":["a","b"]})", "prompt", "exactly one string"},
      {C, R"({"prompt":"x","max_tokens":-1})", "max_tokens", "must be in 1..1000"},
      {C, R"({"prompt":"x","max_tokens":0})", "max_tokens", "must be in 1..1000"},
      {C, R"({"prompt":"x","max_tokens":1001})", "max_tokens", "--max-tokens limit is 1000"},
      {C, R"({"prompt":"x","max_tokens":1e30})", "max_tokens", "must be an integer"},
      {C, R"({"prompt":"x","max_tokens":99999999999999999999999})", "max_tokens", "must be an integer"},
      {C, R"({"prompt":"x","max_tokens":"10"})", "max_tokens", "must be an integer (got a string)"},
      {C, R"({"prompt":"x","max_tokens":2.5})", "max_tokens", "must be an integer"},
      {C, R"({"prompt":"x","temperature":"hot"})", "temperature", "must be a number"},
      {C, R"({"prompt":"x","temperature":2.5})", "temperature", "must be in [0, 2]"},
      {C, R"({"prompt":"x","top_p":0})", "top_p", "must be in (0, 1]"},
      {C, R"({"prompt":"x","min_p":1})", "min_p", "must be in [0, 1)"},
      {C, R"({"prompt":"x","top_k":-1})", "top_k", "must be in 0.."},
      {C, R"({"prompt":"x","seed":1.5})", "seed", "must be an integer"},
      {C, R"({"prompt":"x","stream":"yes"})", "stream", "must be a boolean"},
      {C, R"({"prompt":"x","stop":7})", "stop", "must be a string or an array"},
      {C, R"({"prompt":"x","stop":["a","b","c","d","e"]})", "stop", "at most 4"},
      {C, R"({"prompt":"x","stop":[""]})", "stop", "must not be empty"},
      {C, R"({"prompt":"x","model":3})", "model", "must be a string"},
      {C, R"({"prompt":"x","n":17})", "n", "must be in 1..16"},
      {C, R"({"prompt":"x","logprobs":6})", "logprobs", "must be in 0..5"},
      {C, R"({"prompt":"x","best_of":2})", "best_of", "must be 1"},
      {H, R"({"messages":[{"role":"user","content":"x"}],"logprobs":1})", "logprobs", "must be a boolean"},
      {H, R"({"messages":[{"role":"user","content":"x"}],"top_logprobs":2})", "top_logprobs", "needs 'logprobs'"},
      {C, R"({"prompt":"x","logit_bias":{"a":1}})", "logit_bias", "a key must be a token id"},
      {C, R"({"prompt":"x","logit_bias":{"5":101}})", "logit_bias", "in [-100, 100]"},
      {C, R"({"prompt":"x","logit_bias":[[5,false]]})", "logit_bias", "use -100"},
      {C, R"({"prompt":"x","repeat_last_n":-2})", "repeat_last_n", "must be in -1.."},
      {C, R"({"prompt":"x","samplers":["top_k"]})", "samplers", "not supported"},
      {C, R"({"prompt":"x","echo":true})", "echo", "not supported"},
      {C, R"({"prompt":"x","presence_penalty":2.5})", "presence_penalty", "must be in [-2, 2]"},
      {H, R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function"}]})", "tools",
       "tools[0].function must be an object"},
      {H, R"({"messages":[{"role":"user","content":"x"}],"tools":{}})", "tools", "must be an array"},
      {H, R"({"messages":[{"role":"user","content":"x"}],"tool_choice":"required"})", "tool_choice",
       "'tools' declares no function"},
      {H, R"({"messages":[{"role":"user","content":"x"}],"tool_choice":"maybe","tools":[]})", "tool_choice",
       "must be \"auto\""},
      {H, R"({"messages":[{"role":"user","content":"x"}],"tool_choice":{"type":"function","function":{"name":"g"}},
              "tools":[{"type":"function","function":{"name":"f"}}]})", "tool_choice", "'g', which tools does not declare"},
      {H, R"({"messages":[{"role":"user","content":"x"}],"parallel_tool_calls":1})", "parallel_tool_calls",
       "must be a boolean"},
      {H, R"({"messages":[{"role":"user","content":"x"}],"tool_choice":"required","json_schema":{},
              "tools":[{"type":"function","function":{"name":"f"}}]})", "tool_choice", "not both"},
      {H, R"({"messages":[{"role":"tool","content":"x"}]})", "messages[0].tool_call_id", "is required"},
      {H, R"({"messages":[{"role":"assistant","tool_calls":[{"type":"function","function":{"arguments":"{}"}}]}]})",
       "messages[0].tool_calls[0].function.name", "must be a string"},
      {H, R"({"messages":[{"role":"assistant","function_call":{"name":"f"}}]})", "messages[0].function_call",
       "use 'tool_calls'"},
      {C, R"({"prompt":"x","tools":[]})", "tools", "belongs to /v1/chat/completions"},
      {H, R"({})", "messages", "'messages' is required"},
      {H, R"({"messages":{}})", "messages", "must be an array"},
      {H, R"({"messages":[]})", "messages", "at least one"},
      {H, R"({"messages":["hi"]})", "messages[0]", "must be an object"},
      {H, R"({"messages":[{"content":"x"}]})", "messages[0].role", "must be a string"},
      {H, R"({"messages":[{"role":"user"}]})", "messages[0].content", "is required"},
      {H, R"({"messages":[{"role":"user","content":5}]})", "messages[0].content", "must be a string or an array"},
      {H, R"({"messages":[{"role":"user","content":[{"type":"image_url"}]}]})", "messages[0].content[0]",
       "only parts of type"},
      {H, R"({"messages":[{"role":"user","content":"x"}],"chat_template_kwargs":{"enable_thinking":1}})",
       "chat_template_kwargs.enable_thinking", "must be a boolean"},
  };
  for (const Case& c : cases) {
    const ApiError e = Bad(c.endpoint, c.body);
    EXPECT_EQ(e.status, 400) << c.body;
    EXPECT_EQ(e.type, "invalid_request_error") << c.body;
    EXPECT_EQ(e.param, c.param) << c.body;
    EXPECT_NE(e.message.find(c.says), std::string::npos) << c.body << " → " << e.message;
    // The error body is OpenAI's shape.
    const json j = json::parse(e.Json());
    EXPECT_EQ(j["error"]["message"], e.message);
    EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  }
}

// An OpenAI tool loop's messages: the assistant's calls (arguments a string, content null) and the
// tool's result reach the template's messages; tools, tool_choice and parallel_tool_calls the options.
TEST(OpenAiProtocol, ToolLoopMessagesAndOptions) {
  GenerationRequest r = Ok(Endpoint::kChatCompletions, R"({"messages":[
      {"role":"user","content":"Weather?"},
      {"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function",
        "function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}}]},
      {"role":"tool","tool_call_id":"call_1","name":"get_weather","content":"21 C"}],
    "tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}],
    "tool_choice":{"type":"function","function":{"name":"get_weather"}},"parallel_tool_calls":false})");
  ASSERT_EQ(r.messages.size(), 3u);
  EXPECT_EQ(r.messages[1].content, "");
  ASSERT_EQ(r.messages[1].tool_calls.size(), 1u);
  EXPECT_EQ(r.messages[1].tool_calls[0].id, "call_1");
  EXPECT_EQ(r.messages[1].tool_calls[0].name, "get_weather");
  EXPECT_EQ(r.messages[1].tool_calls[0].arguments, R"({"city": "Paris"})");
  EXPECT_EQ(r.messages[2].tool_call_id, "call_1");
  EXPECT_EQ(r.messages[2].name, "get_weather");
  EXPECT_TRUE(r.has_tools);
  EXPECT_EQ(r.tools.choice, ToolChoice::kFunction);
  EXPECT_EQ(r.tools.function, "get_weather");
  EXPECT_FALSE(r.tools.parallel);
  // The definitions keep the order they were sent in (templates print them).
  EXPECT_EQ(r.tools.tools_json, R"([{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}])");
  // Responses: tool_calls in the message (content null), and as indexed stream deltas.
  const ResponseMeta meta{.id = "chatcmpl-1", .created = 1, .model = "m"};
  const std::vector<ToolCall> calls = {{.id = "call_2", .name = "f", .arguments = "{}"}};
  json whole = json::parse(CompletionJson(Endpoint::kChatCompletions, meta, "", FinishReason::kToolCalls, {}, calls));
  EXPECT_EQ(whole["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_TRUE(whole["choices"][0]["message"]["content"].is_null());
  EXPECT_EQ(whole["choices"][0]["message"]["tool_calls"][0]["function"]["name"], "f");
  EXPECT_EQ(whole["choices"][0]["message"]["tool_calls"][0]["id"], "call_2");
  // A call streamed: its first entry names it (arguments ""), the next carries only arguments.
  const ChunkDelta delta{.text = "", .reasoning = "", .calls = {{.index = 3, .id = "call_2", .name = "f", .arguments = ""},
                                                                {.index = 3, .id = "", .name = "", .arguments = "{}"}},
                         .logprobs = {}};
  json chunk = json::parse(StreamChunkJson(Endpoint::kChatCompletions, meta, delta, false, std::nullopt, nullptr));
  const json& entries = chunk["choices"][0]["delta"]["tool_calls"];
  EXPECT_EQ(entries[0], json::parse(R"({"index": 3, "id": "call_2", "type": "function",
                                        "function": {"name": "f", "arguments": ""}})"));
  EXPECT_EQ(entries[1], json::parse(R"({"index": 3, "function": {"arguments": "{}"}})"));
}

// kvq's four finish reasons in OpenAI's two: a full context is "length", a cancel "stop".
TEST(OpenAiProtocol, FinishReasonsMapToOpenAis) {
  EXPECT_EQ(OpenAiFinishReason(kvq::FinishReason::kStop), FinishReason::kStop);
  EXPECT_EQ(OpenAiFinishReason(kvq::FinishReason::kLength), FinishReason::kLength);
  EXPECT_EQ(OpenAiFinishReason(kvq::FinishReason::kContext), FinishReason::kLength);
  EXPECT_EQ(OpenAiFinishReason(kvq::FinishReason::kCancelled), FinishReason::kStop);
}

TEST(OpenAiProtocol, ResponseAndChunkShapes) {
  const ResponseMeta meta{.id = "cmpl-1", .created = 123, .model = "m"};
  const Usage usage{.prompt_tokens = 5, .completion_tokens = 3, .cached_tokens = 2};
  json c = json::parse(CompletionJson(Endpoint::kCompletions, meta, "abc", FinishReason::kLength, usage));
  EXPECT_EQ(c["object"], "text_completion");
  EXPECT_EQ(c["choices"][0]["text"], "abc");
  EXPECT_EQ(c["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(c["usage"]["total_tokens"], 8);
  EXPECT_EQ(c["usage"]["prompt_tokens_details"]["cached_tokens"], 2);
  json h = json::parse(CompletionJson(Endpoint::kChatCompletions, meta, "hi", FinishReason::kStop, usage));
  EXPECT_EQ(h["object"], "chat.completion");
  EXPECT_EQ(h["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(h["choices"][0]["message"]["content"], "hi");
  json role = json::parse(StreamChunkJson(Endpoint::kChatCompletions, meta, ChunkDelta{}, true, std::nullopt, nullptr));
  EXPECT_EQ(role["object"], "chat.completion.chunk");
  EXPECT_EQ(role["choices"][0]["delta"]["role"], "assistant");
  EXPECT_TRUE(role["choices"][0]["finish_reason"].is_null());
  json last = json::parse(StreamChunkJson(Endpoint::kChatCompletions, meta, ChunkDelta{}, false, FinishReason::kStop, &usage));
  EXPECT_EQ(last["choices"][0]["finish_reason"], "stop");
  EXPECT_TRUE(last["choices"][0]["delta"].empty());
  EXPECT_EQ(last["usage"]["completion_tokens"], 3);
  json u = json::parse(UsageChunkJson(Endpoint::kCompletions, meta, usage));
  EXPECT_TRUE(u["choices"].empty());
  EXPECT_EQ(SseEvent("{}"), "data: {}\n\n");
  // Bytes that are not UTF-8 (a model may emit any) do not throw: they are replaced.
  json bad = json::parse(CompletionJson(Endpoint::kCompletions, meta, "a\xff", FinishReason::kStop, usage));
  EXPECT_EQ(bad["choices"][0]["text"], "a\xEF\xBF\xBD");
  json models = json::parse(ModelsJson("m", 1));
  EXPECT_EQ(models["data"][0]["id"], "m");
}

}  // namespace
}  // namespace kvq::server
