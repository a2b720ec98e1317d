// LoadModel (see load_model.h).
#include "model/load_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <string_view>
#include <utility>
#include <vector>

#include "gguf/gguf_reader.h"
#include "kvq/log.h"
#include "kvq/units.h"
#include "model/gguf_llama.h"
#include "model/llama2c.h"
#include "weights/weight_type.h"

namespace kvq {
namespace {

// The numbers per weight type of every matrix (before repacking: a tied classifier still views
// the embedding's bytes, so it is counted once; `tied` says so where no matrix has bytes, a
// header-only load).
std::map<WeightType, int64_t> NumbersByType(const DecoderWeights& w, bool tied) {
  std::map<WeightType, int64_t> numbers;
  auto add = [&](const Matrix& m) {
    if (m.rows > 0) numbers[m.type] += m.rows * m.cols;  // absent matrices have no rows
  };
  add(w.token_embedding);
  if (!tied) add(w.classifier);
  for (const LayerWeights& L : w.layers) {
    for (const Matrix* m : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w1, &L.w2, &L.w3, &L.ssm_qkv, &L.ssm_gate, &L.ssm_beta,
                            &L.ssm_alpha, &L.ssm_ba, &L.ssm_out, &L.router, &L.gate_exps, &L.up_exps,
                            &L.down_exps, &L.shared_gate}) {
      add(*m);
    }
  }
  return numbers;
}

}  // namespace

int64_t MemAvailableBytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key, unit;
  int64_t kib = 0;
  while (meminfo >> key >> kib) {
    std::getline(meminfo, unit);
    if (key == "MemAvailable:") return kib * 1024;
  }
  return 0;
}

int64_t RepackHeadroom(int64_t available) { return (int64_t{1} << 30) + available / 10; }

RepackDecision RepackChoice(const DecoderWeights& weights, const RepackOptions& options) {
  switch (options.policy) {
    case RepackPolicy::kNone: return {};
    case RepackPolicy::kAll: return {.parts = {.dense = true, .experts = true}};
    case RepackPolicy::kAuto: break;
  }
  RepackDecision d{.parts = {.dense = true, .experts = true}};
  const int64_t experts = RepackedBytes(weights, {.dense = false, .experts = true});
  if (experts == 0) return d;
  const int64_t available = options.memory_available > 0 ? options.memory_available : MemAvailableBytes();
  if (available <= 0) return d;  // unknown here: repack as on a machine with room
  const int64_t dense = RepackedBytes(weights, {.dense = true, .experts = false});
  const int64_t headroom = RepackHeadroom(available);
  const int64_t room = available - headroom - dense;
  if (experts <= room) return d;
  d.parts.experts = false;
  d.note = fmt::format("experts left in the file's layout: repacking them needs {}, {} available ({} {} less {} "
                       "headroom and {} for the dense matrices' copy); --repack all to force",
                       FormatBytesIec(experts), FormatBytesIec(std::max<int64_t>(room, 0)),
                       options.memory_available > 0 ? "the given" : "MemAvailable", FormatBytesIec(available),
                       FormatBytesIec(headroom), FormatBytesIec(dense));
  return d;
}

Result<DecoderWeights> OpenModelWeights(const std::string& model_path, std::shared_ptr<GgufFile>* gguf_file,
                                        int64_t header_only_file_bytes) {
  if (std::filesystem::path(model_path).extension() != ".gguf") {
    if (header_only_file_bytes > 0) {
      return Status::Error(model_path + ": only a GGUF file (.gguf) can be loaded from its header alone");
    }
    return LoadLlama2c(model_path);
  }
  Result<std::unique_ptr<GgufFile>> opened = header_only_file_bytes > 0
                                                 ? GgufFile::OpenHeader(model_path, header_only_file_bytes)
                                                 : GgufFile::Open(model_path);
  if (!opened.ok()) {
    // A type id the reader does not know (a ggml type newer than it, or a fork's): the reader
    // names the tensor and the id; say what kvq runs too, as LoadGgufLlama does for known types.
    const std::string& m = opened.status().message();
    if (m.find("unknown ggml type id") != std::string_view::npos) {
      return Status::Error(m + " (kvq supports: " + WeightTypeLabelList() + ")");
    }
    return opened.status();
  }
  std::shared_ptr<GgufFile> file = std::move(opened).value();
  if (gguf_file != nullptr) *gguf_file = file;
  return LoadGgufLlama(std::move(file));
}

Result<LoadedModel> LoadModel(const std::string& model_path, const std::string& tokenizer_path,
                              int64_t header_only_file_bytes, const RepackOptions& repack) {
  std::shared_ptr<GgufFile> file;  // null for a llama2.c checkpoint
  Result<DecoderWeights> weights = OpenModelWeights(model_path, &file, header_only_file_bytes);
  if (!weights.ok()) return weights.status();
  const bool header_only = header_only_file_bytes > 0;
  const bool tied = header_only ? !file->FindTensor("output.weight").ok()
                                : weights->classifier.data == weights->token_embedding.data;
  const std::map<WeightType, int64_t> numbers = NumbersByType(*weights, tied);
  int64_t parameters = 0;
  for (const auto& [type, n] : numbers) parameters += n;
  std::vector<std::pair<int64_t, WeightType>> shares;
  for (const auto& [type, n] : numbers) shares.push_back({n, type});
  std::sort(shares.rbegin(), shares.rend());
  std::string weight_types;
  for (const auto& [n, type] : shares) {
    std::string name = WeightTypeName(type);  // "Q4_0": written as the --type flags take it, "q4_0"
    std::transform(name.begin(), name.end(), name.begin(), [](unsigned char ch) { return std::tolower(ch); });
    weight_types += fmt::format("{}{} {:.0f}%", weight_types.empty() ? "" : ", ", name,
                                parameters > 0 ? 100.0 * static_cast<double>(n) / static_cast<double>(parameters) : 0.0);
  }
  // The loaders' matrices view a read-only mapping (base/mapped_file.h): its pages can be released.
  if (!header_only && repack.policy != RepackPolicy::kNone) {
#if defined(__EMSCRIPTEN__)
    // A wasm heap cannot release the mapped copy, so every matrix is repacked over its own bytes:
    // no memory is added, and kAuto has nothing to weigh.
    RepackWeightsInPlace(&weights.value());
#else
    const RepackDecision decision = RepackChoice(*weights, repack);
    if (!decision.note.empty()) Log(LogLevel::kWarning, model_path + ": " + decision.note);
    RepackWeights(&weights.value(), /*release_mapped_pages=*/true, decision.parts);
#endif
  }
  Result<Tokenizer> tokenizer = Status::Error("unreachable");
  if (!tokenizer_path.empty()) {
    tokenizer = Tokenizer::LoadLlama2c(tokenizer_path, weights->config.vocab_size);
  } else if (file) {
    tokenizer = Tokenizer::LoadGguf(*file);
  } else {
    tokenizer = Tokenizer::LoadLlama2c(
        (std::filesystem::path(model_path).parent_path() / "tok512.bin").string(), weights->config.vocab_size);
  }
  if (!tokenizer.ok()) return tokenizer.status();
  if (tokenizer->vocab_size() != weights->config.vocab_size) {
    return Status::Error(model_path + ": the tokenizer has " + std::to_string(tokenizer->vocab_size()) +
                         " tokens; the model's embedding has " + std::to_string(weights->config.vocab_size));
  }
  std::string chat_template;
  if (file) {
    if (Result<std::string> t = file->GetString("tokenizer.chat_template"); t.ok()) chat_template = std::move(t).value();
  }
  return LoadedModel{std::move(weights).value(), std::move(tokenizer).value(), std::move(chat_template), parameters,
                     std::move(weight_types)};
}

}  // namespace kvq
