// ReadHfTokenizerJson (see hf_tokenizer_json.h). The file is parsed with nlohmann-json; every
// field is checked before use so that a file kvq does not understand is refused with its name and
// the field, never misread. nlohmann's own exceptions (a value of an unexpected type somewhere
// this code did not check) are caught here and reported the same way.
#include "text/hf_tokenizer_json.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

#include "text/pre_tokenizer.h"

namespace kvq {
namespace {

using nlohmann::json;

constexpr int32_t kNormal = 1, kControl = 3, kUserDefined = 4, kUnused = 5;  // llama_token_type

// The Split regexes of the tokenizer.json files llama.cpp maps to a pre (convert_hf_to_gguf.py
// tells them apart by hashing a tokenization; here the regex itself must match).
constexpr std::string_view kLlama3Regex =
    R"re((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re";
constexpr std::string_view kTekkenRegex =
    R"re([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)re";
constexpr std::string_view kQwen2Regex =
    R"re((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re";

/// An error about `file`: "FILE: WHAT".
Status Bad(const std::string& file, const std::string& what) {
  return Status::Error(fmt::format("{}: {}", file, what));
}

/// A JSON value for a message, cut to `limit` characters.
std::string Shown(const json& j, size_t limit = 160) {
  std::string s = j.dump(-1, ' ', false, json::error_handler_t::replace);
  if (s.size() > limit) s = s.substr(0, limit) + "...";
  return s;
}

Result<json> ParseFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::Error(fmt::format("cannot open {}", path));
  std::stringstream text;
  text << in.rdbuf();
  json j = json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Bad(path, "not valid JSON");
  if (!j.is_object()) return Bad(path, "not a JSON object");
  return j;
}

std::string TypeOf(const json& j) { return j.is_object() && j.contains("type") && j["type"].is_string() ? j["type"].get<std::string>() : ""; }

/// Whether a string or null field is absent, null or "".
bool Empty(const json& parent, const char* key) {
  if (!parent.contains(key) || parent[key].is_null()) return true;
  return parent[key].is_string() && parent[key].get<std::string>().empty();
}

/// llama.cpp's does_token_look_special (the forms byte-level BPE vocabularies use).
bool LooksSpecial(std::string_view t) {
  if (t == "<pad>" || t == "<mask>" || t == "<2mass>" || t == "[@BOS@]") return true;
  if (t.starts_with("<|") && t.ends_with("|>")) return true;
  return t.starts_with("<\xEF\xBD\x9C") && t.ends_with("\xEF\xBD\x9C>");  // DeepSeek's fullwidth bar
}

/// The NFC flag of a normalizer, or an error for one kvq does not implement.
Result<bool> ReadNormalizer(const std::string& path, const json& root) {
  if (!root.contains("normalizer") || root["normalizer"].is_null()) return false;
  const json& n = root["normalizer"];
  const std::string type = TypeOf(n);
  if (type == "NFC") return true;
  if (type == "Sequence" && n.contains("normalizers") && n["normalizers"].is_array()) {
    bool nfc = false;
    for (const json& each : n["normalizers"]) {
      if (TypeOf(each) != "NFC") {
        return Bad(path, fmt::format("normalizer {} is not one kvq implements (it implements none and NFC)",
                                     Shown(each)));
      }
      nfc = true;
    }
    return nfc;
  }
  return Bad(path, fmt::format("normalizer {} is not one kvq implements (it implements none and NFC)", Shown(n)));
}

/// The tokenizer.ggml.pre name of the file's pre_tokenizer.
Result<std::string> ReadPreTokenizer(const std::string& path, const json& root) {
  const json p = root.contains("pre_tokenizer") ? root["pre_tokenizer"] : json();
  const auto refuse = [&] {
    return Bad(
        path,
        fmt::format(
            "pre_tokenizer {} is not one kvq implements: it reads ByteLevel (GPT-2's "
            "regex) and a Split by Llama 3's, Qwen 2's or Mistral's Tekken regex then ByteLevel",
            Shown(p)));
  };
  const auto byte_level = [](const json& b, bool use_regex) {
    return TypeOf(b) == "ByteLevel" && b.value("add_prefix_space", false) == false &&
           b.value("use_regex", true) == use_regex;
  };
  if (byte_level(p, true)) return std::string("gpt-2");
  if (TypeOf(p) != "Sequence" || !p.contains("pretokenizers") || !p["pretokenizers"].is_array() ||
      p["pretokenizers"].size() != 2) {
    return refuse();
  }
  const json& split = p["pretokenizers"][0];
  if (TypeOf(split) != "Split" || !byte_level(p["pretokenizers"][1], false) ||
      split.value("behavior", "") != "Isolated" || split.value("invert", false) ||
      !split.contains("pattern") || !split["pattern"].is_object() || !split["pattern"].contains("Regex") ||
      !split["pattern"]["Regex"].is_string()) {
    return refuse();
  }
  const std::string regex = split["pattern"]["Regex"].get<std::string>();
  if (regex == kLlama3Regex) return std::string("llama-bpe");
  if (regex == kQwen2Regex) return std::string("qwen2");
  if (regex == kTekkenRegex) return std::string("tekken");
  return refuse();
}

/// A special token's text in tokenizer_config.json: a string, {"content": ...}, or null/absent ("").
Result<std::string> ConfigToken(const std::string& path, const json& config, const char* key) {
  if (!config.contains(key) || config[key].is_null()) return std::string();
  const json& v = config[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return Bad(path, fmt::format("{} is {}, not a token's text", key, Shown(v)));
}

Result<BpeVocabulary> Read(const std::string& path) {
  Result<json> parsed = ParseFile(path);
  if (!parsed.ok()) return parsed.status();
  const json& root = *parsed;
  if (!root.contains("model") || !root["model"].is_object()) return Bad(path, "no \"model\" object");
  const json& model = root["model"];
  const std::string model_type = TypeOf(model);
  if (model_type != "BPE") {
    return Bad(path, fmt::format("model.type is \"{}\"; kvq imports byte-level BPE tokenizers only "
                                 "(model.type \"BPE\")",
                                 model_type));
  }
  if (model.value("byte_fallback", false)) {
    return Bad(path, "model.byte_fallback is true (a SentencePiece-style BPE); kvq imports byte-level BPE only");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (!Empty(model, key)) return Bad(path, fmt::format("model.{} is {}; kvq implements none", key, Shown(model[key])));
  }
  if (model.contains("dropout") && !model["dropout"].is_null() && model["dropout"] != 0) {
    return Bad(path, fmt::format("model.dropout is {}; kvq implements none", Shown(model["dropout"])));
  }
  if (!model.contains("vocab") || !model["vocab"].is_object()) return Bad(path, "model.vocab is not an object");
  if (!model.contains("merges") || !model["merges"].is_array()) return Bad(path, "model.merges is not an array");
  const json& decoder = root.contains("decoder") ? root["decoder"] : json();
  if (TypeOf(decoder) != "ByteLevel") {
    return Bad(path, fmt::format("decoder {} is not ByteLevel, the only one kvq implements", Shown(decoder)));
  }

  BpeVocabulary v;
  Result<bool> nfc = ReadNormalizer(path, root);
  if (!nfc.ok()) return nfc.status();
  v.nfc = *nfc;
  Result<std::string> pre = ReadPreTokenizer(path, root);
  if (!pre.ok()) return pre.status();
  v.pre = *pre;
  const bool ignore_merges = model.value("ignore_merges", false);
  if (ignore_merges != FindPreTokenizer(v.pre)->ignore_merges) {
    return Bad(path, fmt::format("model.ignore_merges is {} but llama.cpp's pre-tokenizer \"{}\" (which this "
                                 "pre_tokenizer is) assumes {}; a GGUF vocabulary cannot say otherwise",
                                 ignore_merges, v.pre, !ignore_merges));
  }

  // Tokens by id: the vocabulary, then the added tokens over it.
  constexpr int64_t kMaxId = std::numeric_limits<int32_t>::max() - 1;
  std::unordered_map<std::string, int32_t> ids;  // text -> id, for the config's names
  const auto place = [&](int64_t id, const std::string& text, int32_t type, bool replace) -> Status {
    if (id < 0 || id > kMaxId) return Bad(path, fmt::format("token \"{}\" has id {}", text.substr(0, 64), id));
    const auto at = static_cast<size_t>(id);
    if (at >= v.tokens.size()) {
      v.tokens.resize(at + 1);
      v.token_types.resize(at + 1, 0);
    }
    if (v.token_types[at] != 0 && !replace) {
      return Bad(path, fmt::format("model.vocab gives id {} to both \"{}\" and \"{}\"", id, v.tokens[at].substr(0, 64),
                                   text.substr(0, 64)));
    }
    v.tokens[at] = text;
    v.token_types[at] = type;
    ids[text] = static_cast<int32_t>(id);
    return Status::Ok();
  };
  for (const auto& [text, id] : model["vocab"].items()) {
    if (!id.is_number_integer()) return Bad(path, fmt::format("model.vocab[\"{}\"] is {}, not an id", text, Shown(id)));
    if (Status s = place(id.get<int64_t>(), text, kNormal, false); !s.ok()) return s;
  }
  if (root.contains("added_tokens") && !root["added_tokens"].is_null()) {
    if (!root["added_tokens"].is_array()) return Bad(path, "added_tokens is not an array");
    for (const json& a : root["added_tokens"]) {
      if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() || !a.contains("content") ||
          !a["content"].is_string()) {
        return Bad(path, fmt::format("added token {} has no integer id and string content", Shown(a)));
      }
      const std::string content = a["content"].get<std::string>();
      for (const char* flag : {"lstrip", "rstrip", "single_word"}) {
        if (a.value(flag, false)) {
          return Bad(path, fmt::format("added token \"{}\" sets {}, which kvq does not implement", content, flag));
        }
      }
      const bool special = a.value("special", false) || LooksSpecial(content);
      if (Status s = place(a["id"].get<int64_t>(), content, special ? kControl : kUserDefined, true); !s.ok()) {
        return s;
      }
    }
  }
  if (v.tokens.empty()) return Bad(path, "model.vocab is empty");
  for (size_t id = 0; id < v.tokens.size(); ++id) {
    if (v.token_types[id] != 0) continue;
    v.tokens[id] = fmt::format("[PAD{}]", id);  // as the converter fills ids no token has
    v.token_types[id] = kUnused;
  }

  const json& merges = model["merges"];
  v.merges.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const json& m = merges[i];
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const size_t space = s.size() > 1 ? s.find(' ', 1) : std::string::npos;
      if (space == std::string::npos || space + 1 >= s.size() || s.find(' ', space + 1) != std::string::npos) {
        return Bad(path, fmt::format("model.merges[{}] is {}, not \"LEFT RIGHT\"", i, Shown(m)));
      }
      v.merges.push_back(s);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      const std::string left = m[0].get<std::string>(), right = m[1].get<std::string>();
      // GGUF stores "left right": a part holding a space could not be told apart.
      if (left.empty() || right.empty() || left.find(' ') != std::string::npos ||
          right.find(' ') != std::string::npos) {
        return Bad(path, fmt::format("model.merges[{}] is {}; a part with a space (or an empty one) cannot be "
                                     "written as a GGUF merge",
                                     i, Shown(m)));
      }
      v.merges.push_back(left + " " + right);
    } else {
      return Bad(path, fmt::format("model.merges[{}] is {}, neither \"LEFT RIGHT\" nor [\"LEFT\", \"RIGHT\"]", i,
                                   Shown(m)));
    }
  }

  const auto id_of = [&](const std::string& file, const char* key, const std::string& text) -> Result<int32_t> {
    if (text.empty()) return -1;
    const auto it = ids.find(text);
    if (it == ids.end()) return Bad(file, fmt::format("{} \"{}\" is no token of {}", key, text, path));
    return it->second;
  };
  if (!Empty(model, "unk_token")) {
    if (!model["unk_token"].is_string()) return Bad(path, "model.unk_token is not a string");
    Result<int32_t> unk = id_of(path, "model.unk_token", model["unk_token"].get<std::string>());
    if (!unk.ok()) return unk.status();
    v.unk = *unk;
  }

  // BOS from the post-processor: TemplateProcessing whose single sequence starts with a special token.
  int32_t template_bos = -1;
  if (root.contains("post_processor") && root["post_processor"].is_object()) {
    const json& pp = root["post_processor"];
    std::vector<json> processors = {pp};
    if (TypeOf(pp) == "Sequence" && pp.contains("processors") && pp["processors"].is_array()) {
      processors.assign(pp["processors"].begin(), pp["processors"].end());
    }
    for (const json& p : processors) {
      if (TypeOf(p) != "TemplateProcessing" || !p.contains("single") || !p["single"].is_array() ||
          p["single"].empty()) {
        continue;
      }
      const json& first = p["single"][0];
      if (first.contains("SpecialToken") && first["SpecialToken"].contains("id") &&
          first["SpecialToken"]["id"].is_string()) {
        Result<int32_t> id = id_of(path, "post_processor's first special token", first["SpecialToken"]["id"]);
        if (!id.ok()) return id.status();
        template_bos = *id;
      }
    }
  }
  v.bos = template_bos;
  if (template_bos >= 0) v.add_bos = true;

  const std::string config_path = (std::filesystem::path(path).parent_path() / "tokenizer_config.json").string();
  std::error_code ec;
  if (std::filesystem::exists(config_path, ec)) {
    Result<json> config = ParseFile(config_path);
    if (!config.ok()) return config.status();
    for (const auto& [key, field] : {std::pair{"bos_token", &v.bos}, std::pair{"eos_token", &v.eos},
                                     std::pair{"pad_token", &v.pad}}) {
      Result<std::string> text = ConfigToken(config_path, *config, key);
      if (!text.ok()) return text.status();
      if (text->empty()) continue;
      Result<int32_t> id = id_of(config_path, key, *text);
      if (!id.ok()) return id.status();
      *field = *id;
    }
    if (config->contains("add_bos_token") && !(*config)["add_bos_token"].is_null()) {
      if (!(*config)["add_bos_token"].is_boolean()) return Bad(config_path, "add_bos_token is not true or false");
      v.add_bos = (*config)["add_bos_token"].get<bool>();
    }
    if (config->contains("chat_template") && !(*config)["chat_template"].is_null()) {
      const json& t = (*config)["chat_template"];
      if (t.is_string()) {
        v.chat_template = t.get<std::string>();
      } else if (t.is_array()) {
        for (const json& named : t) {
          if (named.is_object() && named.value("name", "") == "default" && named.contains("template") &&
              named["template"].is_string()) {
            v.chat_template = named["template"].get<std::string>();
          }
        }
      } else {
        return Bad(config_path, "chat_template is neither a string nor a list of named templates");
      }
    }
  }
  return v;
}

}  // namespace

Result<BpeVocabulary> ReadHfTokenizerJson(const std::string& path) {
  try {
    return Read(path);
  } catch (const json::exception& e) {
    return Bad(path, fmt::format("unexpected JSON content: {}", e.what()));
  }
}

}  // namespace kvq
