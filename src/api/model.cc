// Model (see include/kvq/model.h): LoadModel plus the option checks, metadata and tokenizer calls.
#include <fmt/format.h>

#include <algorithm>
#include <thread>

#include "api/api_internal.h"
#include "api/vocabulary_calls.h"
#include "weights/matvec.h"
#include "model/load_model.h"

namespace kvq {

const char* Version() { return KVQ_VERSION; }

Result<CacheChoice> CacheChoiceFor(const DecoderConfig& c, const KvOptions& kv) {
  auto find = [](const std::string& name, const std::string& what) -> Result<KvSpec> {
    Result<KvSpec> f = ParseKvSpec(name);
    if (!f.ok()) return Status::Error(fmt::format("KvOptions::{}: {}", what, f.status().message()));
    return f;
  };
  CacheChoice choice{.budgets = kv.budgets, .page_positions = kv.page_positions};
  if (kv.layers.empty()) {
    Result<KvSpec> k = find(kv.key_format, "key_format"), v = find(kv.value_format, "value_format");
    if (!k.ok()) return k.status();
    if (!v.ok()) return v.status();
    choice.layers = {LayerFormats::Of(*k, *v)};
  } else {
    for (size_t l = 0; l < kv.layers.size(); ++l) {
      Result<KvSpec> k = find(kv.layers[l].key, fmt::format("layers[{}].key", l));
      Result<KvSpec> v = find(kv.layers[l].value, fmt::format("layers[{}].value", l));
      if (!k.ok()) return k.status();
      if (!v.ok()) return v.status();
      choice.layers.push_back(LayerFormats::Of(*k, *v));
    }
    // KvOptions::layers is a per-layer plan: one entry is not "every layer" there.
    if (choice.layers.size() == 1 && c.n_attention_layers() != 1) {
      return Status::Error(fmt::format("KvOptions::layers has 1 entry; the model has {} layers that attend "
                                       "(give one per layer, or none)", c.n_attention_layers()));
    }
  }
  return choice;
}

Result<KvCacheConfig> CacheConfigFor(const DecoderConfig& c, int64_t model_context, const KvOptions& kv) {
  if (kv.context < 0 || kv.context > model_context) {
    return Status::Error(fmt::format("KvOptions::context must be in 0..{} (the model's context; 0: all of it), "
                                     "got {}", model_context, kv.context));
  }
  const int64_t context = kv.context > 0 ? kv.context : model_context;
  Result<CacheChoice> choice = CacheChoiceFor(c, kv);
  if (!choice.ok()) return choice.status();
  Result<KvCacheConfig> config = ModelCacheConfig(c, context, *choice);
  if (!config.ok()) return Status::Error("KvOptions: " + config.status().message());
  return config;
}

const ModelFingerprint& Model::Impl::fingerprint() const {
  std::call_once(fingerprint_once_, [this] { fingerprint_ = Fingerprint(weights); });
  return fingerprint_;
}

Model::Model(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
Model::~Model() = default;

// kvq::Repack is RepackPolicy (model/load_model.h) seen from the API: the same values.
static_assert(static_cast<int>(Repack::kAuto) == static_cast<int>(RepackPolicy::kAuto) &&
              static_cast<int>(Repack::kAll) == static_cast<int>(RepackPolicy::kAll) &&
              static_cast<int>(Repack::kNone) == static_cast<int>(RepackPolicy::kNone));

namespace {
constexpr Repack kRepacks[] = {Repack::kAuto, Repack::kAll, Repack::kNone};
}  // namespace

const char* RepackName(Repack repack) {
  switch (repack) {
    case Repack::kAuto: return "auto";
    case Repack::kAll: return "all";
    case Repack::kNone: return "none";
  }
  return "?";
}

Result<Repack> ParseRepack(std::string_view name) {
  std::string names;
  for (const Repack r : kRepacks) {
    if (name == RepackName(r)) return r;
    names += names.empty() ? RepackName(r) : fmt::format(", {}", RepackName(r));
  }
  return Status::Error(fmt::format("'{}' is not a repack choice (one of: {})", name, names));
}

Result<std::unique_ptr<Model>> Model::Load(const std::string& path, const ModelOptions& options) {
  return Impl::Load(path, options, 0);
}

Result<std::unique_ptr<Model>> Model::Impl::Load(const std::string& path, const ModelOptions& options,
                                                 int64_t header_only_file_bytes) {
  if (options.threads < 0 || options.threads > 1024) {
    return Status::Error(fmt::format("ModelOptions::threads must be in 0..1024 (got {})", options.threads));
  }
  if (options.context < 0) {
    return Status::Error(fmt::format("ModelOptions::context must be >= 0 (got {})", options.context));
  }
  if (options.repack != Repack::kAuto && options.repack != Repack::kAll && options.repack != Repack::kNone) {
    return Status::Error(fmt::format("ModelOptions::repack must be Repack::kAuto, kAll or kNone (got {})",
                                     static_cast<int>(options.repack)));
  }
  if (options.repack_memory_available < 0) {
    return Status::Error(fmt::format("ModelOptions::repack_memory_available must be >= 0 (got {})",
                                     options.repack_memory_available));
  }
  const RepackOptions repack{.policy = static_cast<RepackPolicy>(options.repack),
                             .memory_available = options.repack_memory_available};
  Result<LoadedModel> loaded = LoadModel(path, options.tokenizer_path, header_only_file_bytes, repack);
  if (!loaded.ok()) return loaded.status();
  auto impl = std::make_shared<Impl>();
  impl->header_only = header_only_file_bytes > 0;
  impl->weights = std::move(loaded.value().weights);
  impl->tokenizer = std::move(loaded.value().tokenizer);
  impl->options = options;
  const DecoderConfig& c = impl->weights.config;
  if (options.context > c.seq_len) {
    return Status::Error(fmt::format("{}: ModelOptions::context {} is past the model's context of {} positions",
                                     path, options.context, c.seq_len));
  }
  const int32_t hardware = static_cast<int32_t>(std::thread::hardware_concurrency());
  const int32_t threads = options.threads > 0 ? options.threads : std::clamp(hardware, 1, 1024);
  impl->options.threads = threads;
  impl->info = {.path = path, .architecture = c.arch, .n_layers = c.n_layers,
                .n_attention_layers = c.n_attention_layers(), .state_bytes = c.state_floats() * 4, .dim = c.dim,
                .hidden_dim = c.hidden_dim, .n_heads = c.n_heads, .n_kv_heads = c.n_kv_heads,
                .head_dim = c.head_dim(), .vocab_size = c.vocab_size, .trained_context = c.seq_len,
                .context = options.context > 0 ? options.context : c.seq_len,
                .rope_theta = c.rope_theta, .threads = threads, .bos = impl->tokenizer.bos(),
                .eos = impl->tokenizer.eos(), .chat_template = std::move(loaded.value().chat_template),
                .parameters = loaded->parameters, .weight_types = loaded->weight_types,
                .simd_target = MatVecTargetName()};
  // Check the default KV options now, so a bad format or budget is reported by Load.
  if (Result<KvCacheConfig> kv = CacheConfigFor(c, impl->info.context, options.kv); !kv.ok()) {
    return kv.status();
  }
  return std::unique_ptr<Model>(new Model(std::move(impl)));
}

const ModelInfo& Model::info() const { return impl_->info; }
const ModelFingerprint& Model::fingerprint() const { return impl_->fingerprint(); }

std::vector<int32_t> Model::Tokenize(std::string_view text, AddBos add_bos) const {
  return TokenizeWith(impl_->tokenizer, text, add_bos);
}

Result<std::string> Model::Detokenize(std::span<const int32_t> ids) const {
  return DetokenizeWith(impl_->tokenizer, impl_->info.vocab_size, ids);
}

void Model::Impl::BuildGrammarVocabulary() const {
  std::call_once(grammar_once_, [this] {
    // Text as a token follows another token: for SentencePiece not after BOS, where Decode drops
    // the space Encode put in front (a completion's first token after a lone BOS may then differ
    // from what the mask assumed by that space; Generator::Next refuses it if the grammar does).
    const int32_t vocab = info.vocab_size;
    const int32_t previous = tokenizer.bos() == 0 ? std::min(1, vocab - 1) : 0;
    std::vector<std::string> texts(static_cast<size_t>(vocab));
    for (int32_t t = 0; t < vocab; ++t) {
      if (kvq::IsEndOfGeneration(*this, t)) {
        end_tokens_.push_back(t);  // left out of the trie: Constrain decides them
      } else {
        texts[t] = kvq::TokenText(*this, previous, t);
      }
    }
    token_trie_ = std::make_unique<TokenTrie>(texts);
  });
}

const TokenTrie& Model::Impl::token_trie() const {
  BuildGrammarVocabulary();
  return *token_trie_;
}

const std::vector<int32_t>& Model::Impl::end_tokens() const {
  BuildGrammarVocabulary();
  return end_tokens_;
}

int32_t Model::Impl::ControlToken(std::string_view text) const {
  std::call_once(control_once_, [this] {
    const int32_t vocab = info.vocab_size;
    for (int32_t t = 0; t < vocab; ++t) {
      const std::string& piece = tokenizer.piece(t);
      if (!piece.empty() && tokenizer.Decode(0, t).empty()) control_tokens_.emplace(piece, t);
    }
  });
  const auto it = control_tokens_.find(std::string(text));
  return it == control_tokens_.end() ? -1 : it->second;
}

std::string TokenText(const Model::Impl& model, int32_t previous, int32_t token) {
  return TokenTextWith(model.tokenizer, model.info.vocab_size, previous, token);
}

bool IsEndOfGeneration(const Model::Impl& model, int32_t id) {
  return id >= 0 && id < model.info.vocab_size && model.tokenizer.IsEndOfGeneration(id);
}

std::string Model::TokenText(int32_t previous, int32_t token) const { return kvq::TokenText(*impl_, previous, token); }

std::string Model::TokenPiece(int32_t id) const { return TokenPieceWith(impl_->tokenizer, impl_->info.vocab_size, id); }

bool Model::IsEndOfGeneration(int32_t id) const { return kvq::IsEndOfGeneration(*impl_, id); }

Result<std::unique_ptr<Session>> Model::NewSession() const { return NewSession(impl_->options.kv); }

Result<std::unique_ptr<Session>> Model::NewSession(const KvOptions& kv) const {
  if (impl_->header_only) {
    return Status::Error(impl_->info.path + ": loaded from its header alone (its weights are read by the GPU "
                         "path), so the CPU forward cannot run it: load the whole file for that");
  }
  Result<KvCacheConfig> config = CacheConfigFor(impl_->weights.config, impl_->info.context, kv);
  if (!config.ok()) return config.status();
  Result<std::unique_ptr<KvCache>> cache = KvCache::Create(*config);
  if (!cache.ok()) return cache.status();
  auto impl = std::make_unique<Session::Impl>(impl_, std::move(config).value(), std::move(cache).value());
  return std::unique_ptr<Session>(new Session(std::move(impl)));
}

}  // namespace kvq
