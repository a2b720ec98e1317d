// llama.cpp's "_logits_" file: what `llama-perplexity --kl-divergence-base FILE` writes and
// `llama-perplexity --kl-divergence` reads. kvq reads and writes it so kvq's logits can be compared
// with llama.cpp's on any model, in either direction. The layout and the evaluation it records,
// as read in ggml-org/llama.cpp tools/perplexity/perplexity.cpp (perplexity() writes the file,
// kl_divergence() reads it, log_softmax() encodes a position); every field little-endian:
//
//   char    magic[8]                "_logits_"
//   int32   n_ctx                   chunk length in tokens (llama-perplexity -c; 512 by default)
//   int32   n_vocab                 the model's vocabulary size
//   int32   n_chunk                 number of chunks: n_tokens / n_ctx rounded down (the tail is dropped)
//   int32   tokens[n_chunk][n_ctx]  the text's ids as tokenized (BOS first when the vocabulary adds
//                                   one) — not with the per-chunk BOS substitution described below
//   then for each chunk, for each scored position j = n_ctx/2 .. n_ctx − 2 (n_ctx − 1 − n_ctx/2
//   records a chunk), one record of 2·⌈n_vocab/2⌉ + 4 uint16 (a multiple of 4 bytes):
//     float   scale                 (max_logit − min_logit) / 65535
//     float   min_log_prob          min_logit − max_logit − log Σ_i exp(logit_i − max_logit)
//     uint16  q[n_vocab]            round((logit_i − min_logit) / scale), 0 where logit_i ≤ min_logit
//                                   (all 0 when scale is 0)
//     uint16  pad[n_vocab % 2]      llama.cpp leaves it unset; kvq writes 0
//   where min_logit = max(min_i logit_i, max_logit − 16), so that log p_i = scale·q_i + min_log_prob
//   within scale/2 for every i whose logit is above min_logit (log-probs more than 16 below the
//   top one are all clamped to min_log_prob).
//
// The evaluation both tools run: chunk c is tokens[c·n_ctx .. (c+1)·n_ctx) at positions 0..n_ctx−1
// of a freshly cleared cache, its first token replaced by BOS when the vocabulary adds BOS (so every
// chunk starts from BOS; the ids in the file keep the text's own token there). Only the second half
// of a chunk is scored (first = n_ctx/2, so every scored position has at least n_ctx/2 tokens of
// context): the record of position j is the distribution predicting tokens[c·n_ctx + j + 1].
// llama-perplexity needs at least 2·n_ctx tokens to write a file; its reader accepts any n_chunk ≥ 1.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/mapped_file.h"
#include "kvq/status.h"

namespace kvq {

/// The header's three numbers and the sizes they imply.
struct LlamaLogitsLayout {
  int32_t n_ctx = 0;
  int32_t n_vocab = 0;
  int32_t n_chunk = 0;

  /// The first scored position of a chunk: n_ctx / 2.
  int32_t first() const { return n_ctx / 2; }
  /// Scored positions (records) per chunk: n_ctx − 1 − n_ctx/2.
  int32_t scored_per_chunk() const { return n_ctx - 1 - n_ctx / 2; }
  /// uint16 values per record: 4 (the two floats) + n_vocab rounded up to even.
  int64_t record_u16() const { return 4 + 2 * ((static_cast<int64_t>(n_vocab) + 1) / 2); }
  int64_t header_bytes() const { return 20 + 4 * static_cast<int64_t>(n_chunk) * n_ctx; }
  /// The whole file's size.
  int64_t file_bytes() const {
    return header_bytes() + static_cast<int64_t>(n_chunk) * scored_per_chunk() * record_u16() * 2;
  }
};

/// Encodes one position's logits [n_vocab] into `record` [record_u16] as llama.cpp does (scale,
/// min_log_prob, the uint16 codes rounded to nearest, ties to even; a zero pad for an odd vocabulary).
/// The log-sum-exp is summed in double. Non-finite logits are the caller's to refuse.
void EncodeLlamaLogProbs(const float* logits, int32_t n_vocab, uint16_t* record);

/// One record read back: the log-probability of every token, decoded in double.
class LlamaLogProbs {
 public:
  /// `record` [record_u16] must outlive the view.
  explicit LlamaLogProbs(const uint16_t* record);
  float scale() const { return scale_; }
  float min_log_prob() const { return min_log_prob_; }
  uint16_t code(int32_t i) const { return codes_[i]; }
  /// scale·q_i + min_log_prob, in double.
  double LogProb(int32_t i) const {
    return static_cast<double>(scale_) * codes_[i] + static_cast<double>(min_log_prob_);
  }

 private:
  float scale_ = 0, min_log_prob_ = 0;
  const uint16_t* codes_ = nullptr;  // [n_vocab]
};

/// A "_logits_" file, mapped; its header and tokens checked when opened, its records read in place.
class LlamaLogitsReader {
 public:
  /// Maps and checks `path`: the magic, n_ctx ≥ 3 (at least one scored position), n_vocab ≥ 1,
  /// n_chunk ≥ 1, the file's size equal to the layout's (a truncated file, or one with bytes after
  /// its last record, is refused with both sizes), and every token id in 0..n_vocab−1. Errors name
  /// the file, what was found and what was expected.
  static Result<LlamaLogitsReader> Open(const std::string& path);

  const std::string& path() const { return path_; }
  const LlamaLogitsLayout& layout() const { return layout_; }
  /// The ids of every chunk, [n_chunk][n_ctx], as stored.
  std::span<const int32_t> tokens() const { return tokens_; }

  /// Chunk `c`'s scored position `j` (first ≤ j ≤ n_ctx − 2). Errors (naming the file, the chunk
  /// and the position) when its scale is negative or not finite, or min_log_prob is not finite
  /// or above 0.
  Result<LlamaLogProbs> Record(int32_t c, int32_t j) const;

 private:
  std::string path_;
  std::shared_ptr<MappedFile> file_;
  LlamaLogitsLayout layout_;
  std::vector<int32_t> tokens_;  // [n_chunk][n_ctx]
};

/// Writes a "_logits_" file: the header and tokens at Create, then one record per scored
/// position in file order (chunk by chunk, position n_ctx/2 .. n_ctx−2), then Close.
class LlamaLogitsWriter {
 public:
  /// `tokens` [n_chunk][n_ctx]: n_chunk = tokens.size() / n_ctx, which must be whole and ≥ 1;
  /// n_ctx ≥ 3; every id in 0..n_vocab−1. Errors name the file.
  static Result<std::unique_ptr<LlamaLogitsWriter>> Create(const std::string& path, int32_t n_ctx,
                                                           int32_t n_vocab, std::span<const int32_t> tokens);
  ~LlamaLogitsWriter();
  LlamaLogitsWriter(const LlamaLogitsWriter&) = delete;
  LlamaLogitsWriter& operator=(const LlamaLogitsWriter&) = delete;

  const LlamaLogitsLayout& layout() const { return layout_; }
  /// The next record: the logits [n_vocab] of the next scored position. Errors past the last one,
  /// on a non-finite logit (naming the chunk and position) and on a write error.
  Status Append(const float* logits);
  /// Checks that every record was appended and flushes and closes the file; a file left
  /// incomplete (Close not reached or failed) is removed, so no truncated file is left behind.
  Status Close();

 private:
  LlamaLogitsWriter(std::string path, std::FILE* f, LlamaLogitsLayout layout)
      : path_(std::move(path)), file_(f), layout_(layout), record_(layout.record_u16()) {}
  std::string path_;
  std::FILE* file_ = nullptr;
  LlamaLogitsLayout layout_;
  int64_t written_ = 0;            // records appended
  std::vector<uint16_t> record_;  // [record_u16]
};

}  // namespace kvq
