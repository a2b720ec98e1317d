// `kvq eval fidelity`'s entry over the public API: teacher-forced fidelity of KV arms against an
// f32 cache (measure/fidelity.h) and the llama.cpp comparison through its logits file
// (measure/kl_divergence.h, measure/llama_logits_file.h), on a loaded Model. This header is over
// include/, plan/ and measure_report/ alone, so the CLI calls it without seeing the model layer
// the measurements run on (measure/ linked privately, as plan_search/ links it).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "measure_report/fidelity_report.h"
#include "kvq/kv_spec.h"
#include "kvq/model.h"
#include "kvq/status.h"

namespace kvq {

/// The ids a fidelity run feeds for `text`: encoded by the model's vocabulary with BOS first when
/// it asks for one (MakeFidelityInput), cut to the first `context` ids (−1: not cut).
struct FidelityTokens {
  std::vector<int32_t> tokens;
  int64_t full_count = 0;  ///< ids the whole text gives; > tokens.size() when it was cut
  /// The BOS id put first (and, in the llama.cpp comparison, first in every chunk); −1 when the
  /// vocabulary adds none.
  int32_t bos = -1;
};
FidelityTokens FidelityTokensOf(const Model& model, std::string_view text, int64_t context);

/// Runs `tokens` through an f32 reference cache and a cache of each arm of `config` on a forward
/// pass of the model's own weights (ModelInfo::threads threads; the numbers do not depend on
/// them): RunFidelity. `progress` (may be empty) gets one line per arm.
Result<FidelityReport> EvalFidelity(const Model& model, std::span<const int32_t> tokens, const FidelityConfig& config,
                                    const std::function<void(const std::string&)>& progress);

/// A llama.cpp logits file (llama-perplexity --kl-divergence-base FILE) opened for comparison.
class KlBaseFile {
 public:
  /// Opens and checks the file's header and size. Errors name the file and what was wrong.
  static Result<KlBaseFile> Open(const std::string& path);
  KlBaseFile(KlBaseFile&&) noexcept;
  KlBaseFile& operator=(KlBaseFile&&) noexcept;
  ~KlBaseFile();

  int32_t n_ctx() const;  ///< the chunk length it was written with
  /// Ok when the file can be compared with `model` over `text_tokens` (FidelityTokensOf the text,
  /// not cut): its vocabulary and context fit the model and its ids are the text's first
  /// n_chunk·n_ctx. Errors name the file, what it holds and what was expected.
  Status CheckMatches(const Model& model, std::span<const int32_t> text_tokens) const;

  struct Impl;  ///< the measure/ reader (fidelity_eval.cc)
  const Impl& impl() const { return *impl_; }

 private:
  explicit KlBaseFile(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// A llama.cpp logits file kvq writes its own records into (for llama-perplexity --kl-divergence).
class KlOutFile {
 public:
  /// Creates `path` for `chunk_tokens` (n_chunk·n_ctx ids) of `model`'s vocabulary. Errors name it.
  static Result<KlOutFile> Create(const std::string& path, int32_t n_ctx, const Model& model,
                                  std::span<const int32_t> chunk_tokens);
  KlOutFile(KlOutFile&&) noexcept;
  KlOutFile& operator=(KlOutFile&&) noexcept;
  ~KlOutFile();
  /// Finishes the file once every record is written; an error names it.
  Status Close();

  struct Impl;  ///< the measure/ writer (fidelity_eval.cc)
  Impl& impl() { return *impl_; }

 private:
  explicit KlOutFile(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// The ids llama-perplexity evaluates for a text's ids: its first n_chunk·n_ctx, n_chunk =
/// tokens.size() / n_ctx (LlamaChunkTokens).
std::vector<int32_t> KlChunkTokens(std::span<const int32_t> tokens, int32_t n_ctx);

struct KlEvalConfig {
  LayerFormats kv;           ///< the KV spec kvq runs with, for every layer
  int32_t n_ctx = 0;         ///< the chunk length
  const KlBaseFile* base = nullptr;  ///< compare with it (checked by CheckMatches), or none
  KlOutFile* out = nullptr;          ///< write kvq's records into it (closed by the caller), or none
};

/// Runs `chunk_tokens` [n_chunk][n_ctx] as llama-perplexity does (each chunk from a fresh cache,
/// its first id replaced by the vocabulary's BOS when it adds one), the second half of each chunk
/// scored: RunKlDivergence on a forward pass of the model's own weights. `progress` (may be empty)
/// gets a line per chunk.
Result<KlReport> EvalKlDivergence(const Model& model, std::span<const int32_t> chunk_tokens,
                                  const KlEvalConfig& config,
                                  const std::function<void(const std::string&)>& progress);

}  // namespace kvq
