// Reading and writing llama.cpp's "_logits_" file (layout in llama_logits_file.h). The reader maps
// the file and checks its whole size up front, so a record read later can never run off its end.
#include "measure/llama_logits_file.h"

#include <fmt/core.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>

namespace kvq {
namespace {

static_assert(std::endian::native == std::endian::little,
              "the _logits_ file is little-endian; a big-endian host would need byte swaps here");

constexpr char kMagic[8] = {'_', 'l', 'o', 'g', 'i', 't', 's', '_'};
constexpr int64_t kHeaderBytes = 20;  // magic, n_ctx, n_vocab, n_chunk

int32_t ReadI32(const uint8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// The magic as printable text for an error ("\x00" for unprintable bytes).
std::string Printable(const uint8_t* p, int64_t n) {
  std::string s;
  for (int64_t i = 0; i < n; ++i) {
    const unsigned char ch = p[i];
    s += (ch >= 0x20 && ch < 0x7f) ? std::string(1, static_cast<char>(ch)) : fmt::format("\\x{:02x}", ch);
  }
  return s;
}

std::string Describe(const LlamaLogitsLayout& l) {
  return fmt::format("n_ctx {}, n_vocab {}, n_chunk {}", l.n_ctx, l.n_vocab, l.n_chunk);
}

}  // namespace

void EncodeLlamaLogProbs(const float* logits, int32_t n_vocab, uint16_t* record) {
  float max_logit = logits[0], min_logit = logits[0];
  for (int32_t i = 1; i < n_vocab; ++i) {
    max_logit = std::max(max_logit, logits[i]);
    min_logit = std::min(min_logit, logits[i]);
  }
  // Log-probabilities more than 16 below the top one share the lowest code.
  min_logit = std::max(min_logit, max_logit - 16.0f);
  double sum = 0;
  for (int32_t i = 0; i < n_vocab; ++i) sum += std::exp(static_cast<double>(logits[i]) - max_logit);
  const float log_sum_exp = static_cast<float>(std::log(sum));
  const float min_log_prob = min_logit - max_logit - log_sum_exp;
  const float scale = (max_logit - min_logit) / 65535.0f;
  std::memcpy(record, &scale, sizeof scale);
  std::memcpy(record + 2, &min_log_prob, sizeof min_log_prob);
  uint16_t* q = record + 4;  // [n_vocab] then the pad
  if (scale > 0) {
    const float inv_scale = 1.0f / scale;
    for (int32_t i = 0; i < n_vocab; ++i) {
      // nearbyint in the default rounding mode: nearest, ties to even (llama.cpp's nearest_int).
      const float code = logits[i] > min_logit ? std::nearbyint(inv_scale * (logits[i] - min_logit)) : 0.0f;
      q[i] = static_cast<uint16_t>(std::clamp(code, 0.0f, 65535.0f));
    }
  } else {
    std::fill(q, q + n_vocab, uint16_t{0});
  }
  if (n_vocab % 2 != 0) q[n_vocab] = 0;
}

LlamaLogProbs::LlamaLogProbs(const uint16_t* record) : codes_(record + 4) {
  std::memcpy(&scale_, record, sizeof scale_);
  std::memcpy(&min_log_prob_, record + 2, sizeof min_log_prob_);
}

Result<LlamaLogitsReader> LlamaLogitsReader::Open(const std::string& path) {
  Result<std::shared_ptr<MappedFile>> mapped = MapFile(path, fmt::format("llama.cpp logits file '{}'", path));
  if (!mapped.ok()) return mapped.status();
  LlamaLogitsReader r;
  r.path_ = path;
  r.file_ = *mapped;
  const uint8_t* d = r.file_->data;
  const int64_t size = r.file_->size;
  if (size < kHeaderBytes) {
    return Status::Error(fmt::format(
        "{}: truncated: {} bytes, but a llama.cpp logits file's header alone is {} bytes "
        "(\"_logits_\", n_ctx, n_vocab, n_chunk)", path, size, kHeaderBytes));
  }
  if (std::memcmp(d, kMagic, sizeof kMagic) != 0) {
    return Status::Error(fmt::format(
        "{}: not a llama.cpp logits file: it starts with \"{}\", expected \"_logits_\" (the file "
        "llama-perplexity --kl-divergence-base writes)", path, Printable(d, 8)));
  }
  LlamaLogitsLayout& l = r.layout_;
  l.n_ctx = ReadI32(d + 8);
  l.n_vocab = ReadI32(d + 12);
  l.n_chunk = ReadI32(d + 16);
  if (l.n_ctx < 3) {
    return Status::Error(fmt::format("{}: n_ctx is {}; expected at least 3 (a chunk scores positions "
                                     "n_ctx/2 .. n_ctx-2)", path, l.n_ctx));
  }
  if (l.n_vocab < 1) return Status::Error(fmt::format("{}: n_vocab is {}; expected at least 1", path, l.n_vocab));
  if (l.n_chunk < 1) return Status::Error(fmt::format("{}: n_chunk is {}; expected at least 1", path, l.n_chunk));
  // Every factor is below 2^31, so the products fit int64 unless the header is absurd; a file
  // that large cannot exist on disk anyway, and the size comparison below refuses it.
  const int64_t expected = l.file_bytes();
  if (size < expected) {
    return Status::Error(fmt::format(
        "{}: truncated: {} bytes, expected {} for its header ({}: {} token ids and {} records of {} bytes)",
        path, size, expected, Describe(l), static_cast<int64_t>(l.n_chunk) * l.n_ctx,
        static_cast<int64_t>(l.n_chunk) * l.scored_per_chunk(), l.record_u16() * 2));
  }
  if (size > expected) {
    return Status::Error(fmt::format("{}: {} bytes, expected {} for its header ({}): {} bytes follow the last record",
                                     path, size, expected, Describe(l), size - expected));
  }
  r.tokens_.resize(static_cast<size_t>(l.n_chunk) * l.n_ctx);
  std::memcpy(r.tokens_.data(), d + kHeaderBytes, r.tokens_.size() * sizeof(int32_t));
  for (size_t i = 0; i < r.tokens_.size(); ++i) {
    if (r.tokens_[i] < 0 || r.tokens_[i] >= l.n_vocab) {
      return Status::Error(fmt::format("{}: token {} (chunk {}, position {}) is {}; expected an id in 0..{}", path,
                                       i, i / l.n_ctx, i % l.n_ctx, r.tokens_[i], l.n_vocab - 1));
    }
  }
  return r;
}

Result<LlamaLogProbs> LlamaLogitsReader::Record(int32_t c, int32_t j) const {
  const LlamaLogitsLayout& l = layout_;
  if (c < 0 || c >= l.n_chunk || j < l.first() || j > l.n_ctx - 2) {
    return Status::Error(fmt::format("{}: no record for chunk {} position {} (chunks 0..{}, positions {}..{})",
                                     path_, c, j, l.n_chunk - 1, l.first(), l.n_ctx - 2));
  }
  const int64_t index = static_cast<int64_t>(c) * l.scored_per_chunk() + (j - l.first());
  const uint8_t* p = file_->data + l.header_bytes() + index * l.record_u16() * 2;
  // Records are 4-byte multiples after a 4-byte-multiple header, so p is aligned for uint16.
  LlamaLogProbs view(reinterpret_cast<const uint16_t*>(p));
  if (!std::isfinite(view.scale()) || view.scale() < 0 || !std::isfinite(view.min_log_prob()) ||
      view.min_log_prob() > 0) {
    return Status::Error(fmt::format("{}: the record of chunk {} position {} has scale {} and min_log_prob {}; "
                                     "expected a finite scale >= 0 and a finite log-probability <= 0",
                                     path_, c, j, view.scale(), view.min_log_prob()));
  }
  return view;
}

Result<std::unique_ptr<LlamaLogitsWriter>> LlamaLogitsWriter::Create(const std::string& path, int32_t n_ctx,
                                                                     int32_t n_vocab,
                                                                     std::span<const int32_t> tokens) {
  if (n_ctx < 3) return Status::Error(fmt::format("{}: n_ctx {} is below 3", path, n_ctx));
  if (n_vocab < 1) return Status::Error(fmt::format("{}: n_vocab {} is below 1", path, n_vocab));
  if (tokens.empty() || tokens.size() % static_cast<size_t>(n_ctx) != 0) {
    return Status::Error(fmt::format("{}: {} tokens are not a whole number (>= 1) of chunks of {}", path,
                                     tokens.size(), n_ctx));
  }
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= n_vocab) {
      return Status::Error(fmt::format("{}: token {} is {}; expected an id in 0..{}", path, i, tokens[i], n_vocab - 1));
    }
  }
  const LlamaLogitsLayout layout{.n_ctx = n_ctx, .n_vocab = n_vocab,
                                 .n_chunk = static_cast<int32_t>(tokens.size() / n_ctx)};
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return Status::Error(fmt::format("cannot create {}: {}", path, std::strerror(errno)));
  std::unique_ptr<LlamaLogitsWriter> w(new LlamaLogitsWriter(path, f, layout));
  const int32_t header[3] = {layout.n_ctx, layout.n_vocab, layout.n_chunk};
  if (std::fwrite(kMagic, 1, sizeof kMagic, f) != sizeof kMagic ||
      std::fwrite(header, sizeof(int32_t), 3, f) != 3 ||
      std::fwrite(tokens.data(), sizeof(int32_t), tokens.size(), f) != tokens.size()) {
    return Status::Error(fmt::format("cannot write {}: {}", path, std::strerror(errno)));  // ~ removes it
  }
  return w;
}

LlamaLogitsWriter::~LlamaLogitsWriter() {
  if (file_ != nullptr) {  // not closed: incomplete, so not left for a reader to mistake
    std::fclose(file_);
    std::error_code ec;
    std::filesystem::remove(path_, ec);
  }
}

Status LlamaLogitsWriter::Append(const float* logits) {
  const LlamaLogitsLayout& l = layout_;
  const int64_t total = static_cast<int64_t>(l.n_chunk) * l.scored_per_chunk();
  if (file_ == nullptr || written_ >= total) {
    return Status::Error(fmt::format("{}: all {} records are written already", path_, total));
  }
  const int64_t c = written_ / l.scored_per_chunk(), j = l.first() + written_ % l.scored_per_chunk();
  for (int32_t i = 0; i < l.n_vocab; ++i) {
    if (!std::isfinite(logits[i])) {
      return Status::Error(fmt::format("{}: logit {} of chunk {} position {} is {}; only finite logits can be "
                                       "written", path_, i, c, j, logits[i]));
    }
  }
  EncodeLlamaLogProbs(logits, l.n_vocab, record_.data());
  if (std::fwrite(record_.data(), sizeof(uint16_t), record_.size(), file_) != record_.size()) {
    return Status::Error(fmt::format("cannot write {}: {}", path_, std::strerror(errno)));
  }
  ++written_;
  return Status::Ok();
}

Status LlamaLogitsWriter::Close() {
  const int64_t total = static_cast<int64_t>(layout_.n_chunk) * layout_.scored_per_chunk();
  if (file_ == nullptr) return Status::Error(fmt::format("{}: closed already", path_));
  if (written_ != total) {
    return Status::Error(fmt::format("{}: {} of {} records written; the file is incomplete", path_, written_, total));
  }
  const bool ok = std::fflush(file_) == 0 && std::ferror(file_) == 0;
  const int error = errno;
  const bool closed = std::fclose(file_) == 0;
  file_ = nullptr;
  if (!ok || !closed) {
    std::error_code ec;
    std::filesystem::remove(path_, ec);
    return Status::Error(fmt::format("cannot write {}: {}", path_, std::strerror(ok ? errno : error)));
  }
  return Status::Ok();
}

}  // namespace kvq
