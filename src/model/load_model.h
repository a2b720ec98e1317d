// One entry point for model files: a llama2.c checkpoint (+ tokenizer file) or a GGUF file (its
// own vocabulary unless a tokenizer file is given).
#pragma once

#include <memory>
#include <cstdint>
#include <string>

#include "kvq/status.h"
#include "model/decoder_weights.h"
#include "text/tokenizer.h"

namespace kvq {

class GgufFile;  // gguf/gguf_reader.h

struct LoadedModel {
  DecoderWeights weights;
  Tokenizer tokenizer;
  std::string chat_template;  ///< the GGUF's tokenizer.chat_template, or ""
  /// Numbers in the weight matrices, as the file stores them (a tied classifier counted once;
  /// norm weights and biases aside).
  int64_t parameters = 0;
  /// The matrices' types by their share of those numbers, largest first: "q4_0 96%, q6_k 4%".
  std::string weight_types;
};

/// Which matrices LoadModel repacks for the interleaved kernels (RepackWeights). The values are
/// kvq::Repack's and the C API's KVQ_REPACK_* (include/kvq/model.h, include/kvq.h).
enum class RepackPolicy {
  /// The dense matrices always (their mapped pages are released, so memory does not grow); the
  /// routed experts only when their repacked copy fits in memory (RepackChoice). A mapped
  /// expert stays out of memory until a token routes to it; a repacked one is resident always.
  kAuto = 0,
  kAll = 1,   ///< the experts too, whatever memory there is
  kNone = 2,  ///< nothing: every matrix in the file's layout (the row kernels)
};

struct RepackOptions {
  RepackPolicy policy = RepackPolicy::kAuto;
  /// kAuto: the bytes of memory to count as available; 0: /proc/meminfo's MemAvailable at load.
  int64_t memory_available = 0;
};

/// What RepackChoice decided for a model.
struct RepackDecision {
  RepackParts parts{.dense = false, .experts = false};
  /// Empty, or why kAuto left the experts in the file's layout (one line, logged by LoadModel).
  std::string note;
};

/// kAuto's margin kept free beside the experts' copy: 1 GiB plus a tenth of what is available,
/// room for the KV cache, the activations and the file pages the forward reads.
int64_t RepackHeadroom(int64_t available);

/// The parts of `weights` that `options` repacks. kAuto repacks the experts when
///   experts' repacked bytes ≤ available − RepackHeadroom(available) − the dense matrices' copy,
/// with `available` MemAvailable read before anything is repacked (it already counts what the
/// process holds, and the file's cached pages as reclaimable), or options.memory_available; where
/// neither is known (no /proc/meminfo), it repacks them. RepackedBytes gives both copies' sizes.
RepackDecision RepackChoice(const DecoderWeights& weights, const RepackOptions& options);

/// /proc/meminfo's MemAvailable in bytes, or 0 where it cannot be read.
int64_t MemAvailableBytes();

/// The weights of `model_path` (".gguf": GGUF; anything else: llama2.c) as its loader gives them:
/// views into the file, not repacked, no vocabulary read. `gguf_file` (may be null) receives the
/// opened GGUF file, left null for a llama2.c checkpoint. LoadModel and ModelFile::Read start here.
/// header_only_file_bytes > 0: `model_path` holds only the first bytes of a GGUF file of that many
/// bytes, at least its header (GgufFile::OpenHeader): every matrix and vector has null data.
Result<DecoderWeights> OpenModelWeights(const std::string& model_path, std::shared_ptr<GgufFile>* gguf_file,
                                        int64_t header_only_file_bytes = 0);

/// Loads `model_path` (".gguf": GGUF; anything else: llama2.c). `tokenizer_path` empty: the GGUF
/// file's vocabulary, or tok512.bin beside a llama2.c checkpoint. header_only_file_bytes > 0: a
/// GGUF file's header only (OpenModelWeights): the shape and vocabulary, no weight bytes, nothing
/// repacked (the page's GPU path reads the weights from the file; the CPU forward cannot run).
/// `repack`: which matrices are repacked (RepackChoice); a matrix's layout changes the order of its
/// f32 sums (weights/matvec.h), so the logits depend on the parts repacked.
Result<LoadedModel> LoadModel(const std::string& model_path, const std::string& tokenizer_path,
                              int64_t header_only_file_bytes = 0, const RepackOptions& repack = {});

}  // namespace kvq
