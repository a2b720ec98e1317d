// `kvq eval fidelity`'s entry (see fidelity_eval.h): the loaded model's tokenizer and weights
// handed to measure/'s fidelity and llama.cpp comparison, each on a forward pass of its own.
#include "fidelity_eval/fidelity_eval.h"

#include <utility>

#include "api/api_internal.h"
#include "measure/fidelity.h"
#include "measure/kl_divergence.h"
#include "measure/llama_logits_file.h"

namespace kvq {

struct KlBaseFile::Impl {
  LlamaLogitsReader reader;
};

struct KlOutFile::Impl {
  std::unique_ptr<LlamaLogitsWriter> writer;
};

namespace {

// The BOS id the vocabulary puts first, or −1 (as llama.cpp: only when it adds one).
int32_t AddedBos(const Tokenizer& tokenizer) { return tokenizer.add_bos() ? tokenizer.bos() : -1; }

}  // namespace

FidelityTokens FidelityTokensOf(const Model& model, std::string_view text, int64_t context) {
  const Tokenizer& tokenizer = model.impl().tokenizer;
  FidelityInput in = MakeFidelityInput(tokenizer, text, context);
  return {.tokens = std::move(in.tokens), .full_count = in.full_count, .bos = AddedBos(tokenizer)};
}

Result<FidelityReport> EvalFidelity(const Model& model, std::span<const int32_t> tokens, const FidelityConfig& config,
                                    const std::function<void(const std::string&)>& progress) {
  const Model::Impl& m = model.impl();
  DecoderModel forward(m.weights, m.info.threads);  // a copy of the weight views, as a Session's
  return RunFidelity(forward, tokens, config, progress);
}

KlBaseFile::KlBaseFile(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
KlBaseFile::KlBaseFile(KlBaseFile&&) noexcept = default;
KlBaseFile& KlBaseFile::operator=(KlBaseFile&&) noexcept = default;
KlBaseFile::~KlBaseFile() = default;

Result<KlBaseFile> KlBaseFile::Open(const std::string& path) {
  Result<LlamaLogitsReader> r = LlamaLogitsReader::Open(path);
  if (!r.ok()) return r.status();
  return KlBaseFile(std::make_unique<Impl>(Impl{std::move(r.value())}));
}

int32_t KlBaseFile::n_ctx() const { return impl_->reader.layout().n_ctx; }

Status KlBaseFile::CheckMatches(const Model& model, std::span<const int32_t> text_tokens) const {
  const DecoderConfig& c = model.impl().weights.config;
  return CheckBaseMatches(impl_->reader, c.vocab_size, c.seq_len, text_tokens);
}

KlOutFile::KlOutFile(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
KlOutFile::KlOutFile(KlOutFile&&) noexcept = default;
KlOutFile& KlOutFile::operator=(KlOutFile&&) noexcept = default;
KlOutFile::~KlOutFile() = default;

Result<KlOutFile> KlOutFile::Create(const std::string& path, int32_t n_ctx, const Model& model,
                                    std::span<const int32_t> chunk_tokens) {
  Result<std::unique_ptr<LlamaLogitsWriter>> w =
      LlamaLogitsWriter::Create(path, n_ctx, model.impl().weights.config.vocab_size, chunk_tokens);
  if (!w.ok()) return w.status();
  return KlOutFile(std::make_unique<Impl>(Impl{std::move(w.value())}));
}

Status KlOutFile::Close() { return impl_->writer->Close(); }

std::vector<int32_t> KlChunkTokens(std::span<const int32_t> tokens, int32_t n_ctx) {
  return LlamaChunkTokens(tokens, n_ctx);
}

Result<KlReport> EvalKlDivergence(const Model& model, std::span<const int32_t> chunk_tokens,
                                  const KlEvalConfig& config,
                                  const std::function<void(const std::string&)>& progress) {
  const Model::Impl& m = model.impl();
  const KlRunConfig run{.key = config.kv.key, .value = config.kv.value, .key_transforms = config.kv.key_transforms,
                        .value_transforms = config.kv.value_transforms, .n_ctx = config.n_ctx,
                        .bos = AddedBos(m.tokenizer),
                        .base = config.base != nullptr ? &config.base->impl().reader : nullptr,
                        .out = config.out != nullptr ? config.out->impl().writer.get() : nullptr};
  DecoderModel forward(m.weights, m.info.threads);  // a copy of the weight views, as a Session's
  return RunKlDivergence(forward, chunk_tokens, run, progress);
}

}  // namespace kvq
