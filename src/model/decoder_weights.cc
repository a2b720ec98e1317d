// Fingerprint and RepackWeights (see decoder_weights.h).
#include "model/decoder_weights.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "base/checksum.h"
#include "base/huge_pages.h"
#include "weights/matvec.h"
#include "weights/repack.h"

namespace kvq {

int32_t DecoderConfig::n_attention_layers() const {
  int32_t n = 0;
  for (int32_t l = 0; l < n_layers; ++l) n += is_recurrent(l) ? 0 : 1;
  return n;
}

int32_t DecoderConfig::cache_layer(int32_t layer) const {
  int32_t same_kind = 0;
  for (int32_t l = 0; l < layer; ++l) same_kind += is_recurrent(l) == is_recurrent(layer) ? 1 : 0;
  return same_kind;
}

int64_t DecoderConfig::state_floats() const {
  return int64_t{n_layers - n_attention_layers()} * delta_net.state_floats();
}

ModelFingerprint Fingerprint(const DecoderWeights& w) {
  uint64_t hash = w.fingerprint_seed;
  for (const std::span<const uint8_t> bytes : w.fingerprint_bytes) {
    hash = Checksum64(bytes.data(), bytes.size(), hash);
  }
  return {.n_layers = w.config.n_attention_layers(),
          .n_kv_heads = w.config.n_kv_heads,
          .head_dim = w.config.head_dim(),
          .weights_hash = hash};
}

namespace {

// Whether every expert's slice of the stacked expert tensor `m` ([n_experts · rows][cols]) starts
// on a 16-row group: then the stack repacked as one matrix is, slice by slice, each expert's matrix
// repacked (a group never straddles two experts and there are no tail rows between them), so
// ExpertMatrix's views of it are interleaved matrices themselves (model/moe.h).
bool ExpertSlicesAreGroups(const Matrix& m, int64_t n_experts) {
  return n_experts > 0 && m.rows % n_experts == 0 && (m.rows / n_experts) % kInterleaveRows == 0;
}

// The matrices of `parts` RepackWeights and RepackWeightsInPlace repack, appended to `todo`: every layer's
// projections, and the routed experts' stacks where their slices are whole groups. The experts
// matter most in prefill: a block of 64 tokens routes about 2 rows to each expert (8 of 256
// chosen per token), which the row kernels serve one token at a time and the interleaved kernels
// 16 rows × several tokens at a time (docs/performance.md, "A hybrid's prefill").
void AddRepackable(DecoderWeights* w, std::vector<Matrix*>* todo, RepackParts parts) {
  const int64_t n_experts = w->config.moe.n_experts;
  for (LayerWeights& L : w->layers) {
    for (Matrix* m :
         {&L.wq, &L.wk, &L.wv, &L.wo, &L.w1, &L.w2, &L.w3, &L.ssm_qkv, &L.ssm_gate, &L.ssm_out}) {
      if (parts.dense && CanRepack(*m)) todo->push_back(m);
    }
    for (Matrix* m : {&L.gate_exps, &L.up_exps, &L.down_exps}) {
      if (parts.experts && m->data != nullptr && CanRepack(*m) && ExpertSlicesAreGroups(*m, n_experts)) {
        todo->push_back(m);
      }
    }
  }
}

// AddRepackable and, with the dense part, the classifier: what RepackWeights repacks. A K-quant
// classifier (Q6_K in llama.cpp's K-quant mixes) serves one token per step (prefill needs only the
// last position's logits); CanRepack takes the K-quants only where their interleaved kernels read
// faster than the row kernels one token at a time (KQuantRepackPays; docs/performance.md).
std::vector<Matrix*> RepackList(DecoderWeights* w, RepackParts parts) {
  std::vector<Matrix*> todo;
  AddRepackable(w, &todo, parts);
  if (parts.dense && CanRepack(w->classifier)) todo.push_back(&w->classifier);
  return todo;
}

constexpr int64_t kAlign = 64;  // each matrix's copy starts on a cache line

int64_t AlignedBytes(const Matrix& m) { return (MatrixDataBytes(m) + kAlign - 1) / kAlign * kAlign; }

}  // namespace

int64_t RepackedBytes(const DecoderWeights& w, RepackParts parts) {
  // RepackList only collects pointers; nothing is written through them here.
  int64_t total = 0;
  for (const Matrix* m : RepackList(const_cast<DecoderWeights*>(&w), parts)) total += AlignedBytes(*m);
  return total;
}

int64_t RepackWeights(DecoderWeights* w, bool release_mapped_pages, RepackParts parts) {
  const std::vector<Matrix*> todo = RepackList(w, parts);  // the matrices the interleaved kernels will read
  int64_t total = 0;
  for (const Matrix* m : todo) total += AlignedBytes(*m);
  if (total == 0) return 0;
  // On huge pages where the kernel gives them on request (transparent_hugepage "madvise"): the
  // first write to a 2 MiB page is one fault instead of 512 — a MoE model's experts make the copy
  // most of the file — and decode's streaming reads cross fewer TLB entries.
  std::shared_ptr<uint8_t[]> buffer = AllocatePageBuffer(total, PageSize::kHuge);  // [total] the matrices' copies
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  std::vector<int64_t> offsets;  // [todo] where each matrix's copy starts in the buffer
  int64_t at = 0;
  for (const Matrix* m : todo) {
    offsets.push_back(at);
    at += AlignedBytes(*m);
  }
  // The matrices are independent byte moves into disjoint parts of the buffer: the hardware's
  // threads take them in turn from a shared counter (a load-time pass; no bit depends on it).
  std::atomic<size_t> next{0};
  auto repack = [&] {
    for (size_t i = next++; i < todo.size(); i = next++) {
      Matrix* m = todo[i];
      const Matrix plain = *m;
      *m = RepackMatrix(plain, buffer.get() + offsets[i]);
      // The whole pages inside the matrix's mapped bytes (a page shared with a neighbour stays).
      const auto begin = (reinterpret_cast<uintptr_t>(plain.data) + page - 1) / page * page;
      const auto end = (reinterpret_cast<uintptr_t>(plain.data) + MatrixDataBytes(plain)) / page * page;
      if (release_mapped_pages && end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
    }
  };
  const size_t n_threads = std::min<size_t>({std::max(1u, std::thread::hardware_concurrency()), 8, todo.size()});
  std::vector<std::thread> helpers;
  for (size_t t = 1; t < n_threads; ++t) helpers.emplace_back(repack);
  repack();
  for (std::thread& t : helpers) t.join();
  w->repacked = std::move(buffer);
  return at;
}

namespace {

// Repacks the row-major `m` over its own bytes, kRepackSliceRows rows at a time through `scratch`
// [kRepackSliceRows rows' bytes]: a group of kInterleaveRows rows repacks into exactly the bytes
// it held (weights/repack.h), so each slice is repacked on its own and copied back; the rows % 16
// tail rows are row-major in either layout and stay where they are.
constexpr int64_t kRepackSliceRows = 64 * kInterleaveRows;

void RepackOverItself(Matrix* m, std::vector<uint8_t>* scratch) {
  const int64_t row_bytes = MatrixRowBytes(m->type, m->cols);
  scratch->resize(static_cast<size_t>(kRepackSliceRows * row_bytes));
  auto* bytes = const_cast<uint8_t*>(m->data);  // the caller owns them (LoadModel's heap mapping)
  const int64_t grouped = m->rows / kInterleaveRows * kInterleaveRows;
  for (int64_t row = 0; row < grouped; row += kRepackSliceRows) {
    Matrix slice = *m;
    slice.rows = std::min(kRepackSliceRows, grouped - row);
    slice.data = bytes + row * row_bytes;
    RepackMatrix(slice, scratch->data());
    std::memcpy(bytes + row * row_bytes, scratch->data(), static_cast<size_t>(slice.rows * row_bytes));
  }
  m->layout = MatrixLayout::kInterleaved16;
}

}  // namespace

int64_t RepackWeightsInPlace(DecoderWeights* w) {
  const bool tied = w->classifier.data == w->token_embedding.data;
  const std::vector<Matrix*> todo = RepackList(w, {});  // as RepackWeights, every part
  std::vector<uint8_t> scratch;  // [kRepackSliceRows rows of the matrix in hand] one slice repacked
  int64_t total = 0;
  for (Matrix* m : todo) {
    RepackOverItself(m, &scratch);
    total += MatrixDataBytes(*m);
  }
  // A tied embedding is those same bytes, now interleaved: its rows are read through PlainBlock
  // (DecodeWeightRow), which gathers a row's blocks from either layout, so the embedding's numbers
  // are the file's and the bytes are held once (RepackWeights gives the classifier its own copy).
  if (tied) w->token_embedding = w->classifier;
  return total;
}

}  // namespace kvq
