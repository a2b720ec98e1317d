// kvq serve's routes about the model rather than generation (see http_server.h): the tokenizer
// both ways, the chat template's rendering, the server's settings and its sessions' state. The
// shapes follow llama-server's routes of the same names where it has them, so its clients work.
#include <fmt/format.h>
#include <httplib.h>

#include <nlohmann/json.hpp>

#include "server/http_server.h"

namespace kvq::server {
namespace {

using json = nlohmann::json;

void ReplyError(httplib::Response& res, int status, const std::string& param, const std::string& message) {
  const ApiError e{.status = status, .type = "invalid_request_error", .message = message, .param = param, .code = ""};
  res.status = e.status;
  res.set_content(e.Json(), "application/json");
}

// The body as a JSON object, or false after replying 400.
bool ParseObject(const httplib::Request& req, httplib::Response& res, json* body) {
  *body = json::parse(req.body, nullptr, /*allow_exceptions=*/false);
  if (body->is_discarded() || !body->is_object()) {
    ReplyError(res, 400, "", "the request body must be a JSON object");
    return false;
  }
  return true;
}

// An optional boolean field; false after replying 400 when it is there but not a boolean.
bool OptionalBool(const json& body, const char* field, bool* value, httplib::Response& res) {
  if (!body.contains(field)) return true;
  if (!body[field].is_boolean()) {
    ReplyError(res, 400, field, fmt::format("'{}' must be a boolean", field));
    return false;
  }
  *value = body[field].get<bool>();
  return true;
}

}  // namespace

void HttpServer::InfoRoutes() {
  // vLLM's route of this name: idle sessions drop their caches and KV event subscribers get
  // AllBlocksCleared (snapshots on disk and in a shared store stay).
  Handle("POST", "/reset_prefix_cache", [this](const httplib::Request&, httplib::Response& res) {
    engine().ResetPrefixCache();
    res.set_content("{\"ok\":true}", "application/json");
  });
  // {"content": TEXT, "add_special": false, "with_pieces": false} → {"tokens": [ids]} (with
  // pieces: [{"id", "piece"}]). add_special puts BOS in front when the vocabulary wants one.
  Handle("POST", "/tokenize", [this](const httplib::Request& req, httplib::Response& res) {
    json body;
    if (!ParseObject(req, res, &body)) return;
    if (!body.contains("content") || !body["content"].is_string()) {
      return ReplyError(res, 400, "content", "'content' must be a string (the text to tokenize)");
    }
    bool add_special = false, with_pieces = false;
    if (!OptionalBool(body, "add_special", &add_special, res) || !OptionalBool(body, "with_pieces", &with_pieces, res)) {
      return;
    }
    const std::vector<int32_t> ids =
        model().Tokenize(body["content"].get<std::string>(), add_special ? AddBos::kModelDefault : AddBos::kNo);
    json tokens = json::array();
    for (const int32_t id : ids) {
      tokens.push_back(with_pieces ? json{{"id", id}, {"piece", model().TokenPiece(id)}} : json(id));
    }
    res.set_content(json{{"tokens", tokens}}.dump(), "application/json");
  });
  // {"tokens": [ids]} → {"content": TEXT}, the text as generation writes it.
  Handle("POST", "/detokenize", [this](const httplib::Request& req, httplib::Response& res) {
    json body;
    if (!ParseObject(req, res, &body)) return;
    if (!body.contains("tokens") || !body["tokens"].is_array()) {
      return ReplyError(res, 400, "tokens", "'tokens' must be an array of token ids");
    }
    std::vector<int32_t> ids;
    for (size_t i = 0; i < body["tokens"].size(); ++i) {
      const json& t = body["tokens"][i];
      if (!t.is_number_integer()) {
        return ReplyError(res, 400, "tokens", fmt::format("'tokens[{}]' must be an integer token id", i));
      }
      const int64_t id = t.get<int64_t>();
      if (id < 0 || id >= model().info().vocab_size) {
        return ReplyError(res, 400, "tokens",
                          fmt::format("'tokens[{}]' is {}; ids are in [0, {})", i, id, model().info().vocab_size));
      }
      ids.push_back(static_cast<int32_t>(id));
    }
    Result<std::string> text = model().Detokenize(ids);
    if (!text.ok()) return ReplyError(res, 400, "tokens", text.status().message());
    res.set_content(json{{"content", *text}}.dump(), "application/json");
  });
  // A chat request's body (its messages checked as /v1/chat/completions checks them) → {"prompt":
  // the text the model would be given}.
  Handle("POST", "/apply-template", [this](const httplib::Request& req, httplib::Response& res) {
    std::variant<GenerationRequest, ApiError> parsed =
        ParseGenerationRequest(Endpoint::kChatCompletions, req.body, options_.limits);
    std::variant<std::string, ApiError> prompt = ApiError{};
    if (auto* r = std::get_if<GenerationRequest>(&parsed)) {
      prompt = ChatPrompt(*r);
    } else {
      prompt = std::get<ApiError>(parsed);
    }
    if (auto* e = std::get_if<ApiError>(&prompt)) {
      res.status = e->status;
      return res.set_content(e->Json(), "application/json");
    }
    res.set_content(json{{"prompt", std::get<std::string>(prompt)}}.dump(), "application/json");
  });
  Handle("GET", "/props", [this](const httplib::Request&, httplib::Response& res) {
    const ModelInfo& info = model().info();
    const EngineOptions& eo = engine().options();
    json layers = json::array();
    for (const KvLayerSpec& l : eo.kv.layers) layers.push_back({{"key", l.key}, {"value", l.value}});
    const int64_t context = engine().context();
    const json props = {
        {"model", options_.model_id},
        {"model_path", info.path},
        {"architecture", info.architecture},
        {"layers", info.n_layers},
        {"trained_context", info.trained_context},
        {"context", context},
        {"vocab_size", info.vocab_size},
        {"chat_template", ChatTemplateOrigin()},
        // The texts a chat template sees as bos_token and eos_token ("" when the vocabulary has
        // none), as llama-server's /props gives them.
        {"bos_token", info.bos >= 0 ? model().TokenPiece(info.bos) : ""},
        {"eos_token", info.eos >= 0 ? model().TokenPiece(info.eos) : ""},
        {"kv", {{"key", eo.kv.key_format}, {"value", eo.kv.value_format}, {"layers", layers},
                {"bytes_at_full_context", engine().KvBytesFor(context)}}},
        {"sessions", eo.parallel},
        {"total_slots", eo.parallel},  // llama-server's name for the same number
        {"max_queue", eo.max_queue},
        {"max_tokens_limit", options_.limits.max_tokens_limit},
        {"state", state_.load() == ServerState::kDraining ? "draining" : "ok"},
    };
    res.set_content(props.dump(), "application/json");
  });
  Handle("GET", "/slots", [this](const httplib::Request&, httplib::Response& res) {
    json slots = json::array();
    for (const SlotState& s : engine().Slots()) {
      slots.push_back({{"id", s.id}, {"state", s.state}, {"positions", s.positions}, {"context", s.context},
                       {"prompt_tokens", s.prompt_tokens}, {"prompt_tokens_left", s.prompt_tokens_left},
                       {"reused_tokens", s.reused_tokens}, {"generated_tokens", s.generated_tokens},
                       {"kv_bytes", s.kv_bytes}, {"draft_kv_bytes", s.draft_kv_bytes},
                       {"kv_reserved_bytes", s.kv_reserved_bytes}});
    }
    res.set_content(slots.dump(), "application/json");
  });
}

}  // namespace kvq::server
