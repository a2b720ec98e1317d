// MatVec (see matvec.h): the activation quantiser (foreach_target) and the threaded driver. The
// row kernels are per weight type, in src/weights/<name>/ (registry: weight_type.h); the scalar
// decoders and references are in matvec_reference.cc.
//
// AVX3_DL is compiled in every weight kernel translation unit (the Q8_0/Q4_0 kernels use its
// vpdpbusd), and here, so the target this file reports is the one the kernels run on.
#ifndef HWY_WANT_AVX3_DL
#define HWY_WANT_AVX3_DL
#endif
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "weights/matvec.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>
#include <cstring>
#include <limits>

#include "weights/matvec.h"
#include "weights/repack.h"
#include "weights/weight_type.h"

HWY_BEFORE_NAMESPACE();
namespace kvq {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// ---- Activation quantisation ----
// Per block of 32: amax = max |x|; d = amax / 127 (f32 division); q = RNE(clamp(x / d, ±127)).
// RNE without a conversion instruction: for |t| ≤ 127, t + 1.5·2^23 lands in [2^23, 2^24) where
// the f32 spacing is 1, so the IEEE addition itself rounds t to the nearest integer, ties to even,
// and the low bits of the sum are that integer (bits − 0x4B400000). Every step is a correctly
// rounded IEEE operation, so each target gives the reference's bits.
// A block holding inf or NaN gets d = NaN and q = 0 (x·0 is NaN exactly for those); a block whose
// d is 0 (all zeros, or amax/127 below the smallest subnormal) gets q = 0.
void QuantizeActivationHere(const float* x, int64_t cols, int8_t* q, float* dx) {
  // At most 8 lanes: 512-bit instructions would cost the 256-bit row kernels that follow vector
  // port 1 (and, on some cores, clock speed). N ∈ {1, 2, 4, 8} divides 32.
  using D = hn::CappedTag<float, 8>;
  const D d;
  const hn::Rebind<int32_t, D> di32;
  const hn::Rebind<int8_t, D> di8;
  constexpr int64_t kN = static_cast<int64_t>(hn::MaxLanes(D()));
  constexpr int64_t kK = kActivationBlockElems / kN;
  const auto zero = hn::Zero(d);
  const auto hi = hn::Set(d, 127.0f);
  const auto lo = hn::Set(d, -127.0f);
  const auto magic = hn::Set(d, 12582912.0f);  // 1.5·2^23, bits 0x4B400000
  const auto magic_bits = hn::Set(di32, 0x4B400000);
  const int64_t n_blocks = cols / kActivationBlockElems;
  for (int64_t b = 0; b < n_blocks; ++b) {
    const float* xb = x + b * kActivationBlockElems;
    int8_t* qb = q + b * kActivationBlockElems;
    hn::Vec<D> v[kK];
    auto amax = zero;
    auto nonfinite = zero;
    for (int64_t k = 0; k < kK; ++k) {
      v[k] = hn::LoadU(d, xb + k * kN);
      amax = hn::Max(amax, hn::Abs(v[k]));
      nonfinite = hn::Add(nonfinite, hn::Mul(v[k], zero));
    }
    if (hn::GetLane(hn::SumOfLanes(d, nonfinite)) != 0.0f) {  // NaN: an inf or a NaN in the block
      dx[b] = std::numeric_limits<float>::quiet_NaN();
      std::memset(qb, 0, kActivationBlockElems);
      continue;
    }
    const float scale = hn::GetLane(hn::MaxOfLanes(d, amax)) / 127.0f;
    dx[b] = scale;
    if (scale == 0.0f) {
      std::memset(qb, 0, kActivationBlockElems);
      continue;
    }
    const auto vs = hn::Set(d, scale);
    for (int64_t k = 0; k < kK; ++k) {
      const auto t = hn::Min(hn::Max(hn::Div(v[k], vs), lo), hi);
      const auto r = hn::Sub(hn::BitCast(di32, hn::Add(t, magic)), magic_bits);  // exact, in ±127
      hn::StoreU(hn::DemoteTo(di8, r), di8, qb + k * kN);
    }
  }
}

const char* MatVecTargetNameHere() { return hwy::TargetName(HWY_TARGET); }


}  // namespace HWY_NAMESPACE
}  // namespace kvq
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <fmt/format.h>

#include <array>
#include <atomic>
#include <cstdlib>
#include <deque>
#include <vector>

#include "base/thread_pool.h"

namespace kvq {

HWY_EXPORT(QuantizeActivationHere);
HWY_EXPORT(MatVecTargetNameHere);

namespace {

// Dispatch is resolved once per call, in the calling thread, so the pool's workers never run
// Highway's first-call target selection concurrently: the kernels are fetched here and the
// workers call them through plain pointers.
void InitDispatch() {
  if (!hwy::GetChosenTarget().IsInitialized()) hwy::GetChosenTarget().Update(hwy::SupportedTargets());
}

const WeightTypeDesc& DescOrDie(const char* what, WeightType type) {
  const WeightTypeDesc* desc = FindWeightType(type);
  if (desc == nullptr) {
    // CheckMatrix refuses such a matrix; reaching here is a caller bug.
    fmt::print(stderr, "kvq: {}: weight type id {} is not supported\n", what, static_cast<int>(type));
    std::abort();
  }
  return *desc;
}

// Rows per work item: small matrices stay on one thread. A multiple of kInterleaveRows, so an
// item of a repacked matrix is whole 16-row groups (plus, in the last item, the plain tail).
constexpr int64_t kRowsPerItem = 16;
static_assert(kRowsPerItem % kInterleaveRows == 0);

// Rows [r0, r1) of a kInterleaved16 matrix for tokens [token0, token0 + n_tokens) of s: the 16-row
// groups by the interleaved kernel, the rows % 8 plain tail rows by the row kernel, token by token.
void InterleavedItem(const WeightKernels& k, const Matrix& w, const QuantizedActivation& s,
                     int64_t token0, int64_t n_tokens, float* y, int64_t r0, int64_t r1) {
  const int64_t grouped = w.rows / kInterleaveRows * kInterleaveRows;  // rows in 16-row groups
  const int64_t g1 = std::min(r1, grouped);
  if (r0 < g1) k.interleaved_rows(w.data, s.Token(token0), n_tokens, y, w.rows, w.cols, r0, g1);
  if (std::max(r0, grouped) < r1) {
    for (int64_t j = 0; j < n_tokens; ++j) {
      k.quant_rows(w.data, s.Token(token0 + j), y + j * w.rows, w.cols, std::max(r0, grouped), r1);
    }
  }
}

// One product of a group or of runs, resolved once per call: its kernels, its tokens (x, the
// plain types' input from its first token; token0, its first token in the quantised activation
// s, null for plain types) and where its items start in the call's numbering.
struct GroupProduct {
  const Matrix* w = nullptr;
  float* y = nullptr;
  const WeightKernels* k = nullptr;
  const QuantizedActivation* s = nullptr;
  const float* x = nullptr;  // [n_tokens][cols]
  int64_t token0 = 0;
  int64_t n_tokens = 0;
  int64_t first_item = 0;
};

// Rows [r0, r1) of product p for its tokens: per row and token the kernel MatVec would run, on
// the same quantised activation, so an item's bits do not depend on the group, the item
// boundaries or the thread.
void ProductItem(const GroupProduct& p, int64_t r0, int64_t r1) {
  const Matrix& w = *p.w;
  if (p.s == nullptr) {
    for (int64_t j = 0; j < p.n_tokens; ++j)
      p.k->rows(w.data, p.x + j * w.cols, p.y + j * w.rows, w.cols, r0, r1);
  } else if (w.layout == MatrixLayout::kInterleaved16) {
    // Per row and token the interleaved kernel does the same operations whatever n_tokens (it
    // steps 16 rows × a few tokens at a time), so this equals n_tokens MatVec calls bit for bit.
    InterleavedItem(*p.k, w, *p.s, p.token0, p.n_tokens, p.y, r0, r1);
  } else {
    for (int64_t j = 0; j < p.n_tokens; ++j)
      p.k->quant_rows(w.data, p.s->Token(p.token0 + j), p.y + j * w.rows, w.cols, r0, r1);
  }
}

// The products' row items (kRowsPerItem rows of one product; first_item numbers them across the
// products, in order) computed on the pool, or on the calling thread where `work` (multiply-adds
// in all) is too small for a hand-off to pay.
void RunProducts(std::span<const GroupProduct> products, int64_t items, int64_t work,
                 ThreadPool& pool) {
  if (items == 0) return;
  if (pool.threads() <= 1 || items <= 1 || work < (1 << 16)) {
    for (const GroupProduct& p : products) ProductItem(p, 0, p.w->rows);
    return;
  }
  // Items are handed out from a shared counter rather than split into fixed runs: on a loaded
  // machine a worker that wakes late finds most items done by the threads already running,
  // instead of the others waiting while it does a fixed share. A claim takes a run of
  // consecutive items, a share of what is left (guided scheduling: large runs first, single
  // items at the end), so each thread streams long contiguous stretches of the weights, which
  // the hardware prefetchers follow, instead of 16-row pieces interleaved with the other
  // threads'. Which thread computes an item does not change a bit: every item is the same kernel
  // call on the same rows. Each item meets every token of its product while its rows are in
  // cache, so a product's weights are read from memory once per call, not once per token.
  std::atomic<int64_t> next{0};
  const GroupProduct* const first = products.data();
  const GroupProduct* const last = first + products.size();
  const int64_t share = 2 * int64_t{pool.threads()};  // a claim takes 1/share of the items left
  pool.Run(pool.threads(), [&](int64_t, int32_t) {
    const GroupProduct* p = first;
    int64_t b = next.load(std::memory_order_relaxed);
    while (b < items) {
      const int64_t take = std::max<int64_t>(1, (items - b) / share);
      if (!next.compare_exchange_weak(b, b + take, std::memory_order_relaxed)) continue;  // b reloaded
      for (const int64_t end = b + take; b < end;) {
        while (p + 1 < last && b >= p[1].first_item) ++p;  // items are taken in increasing order
        // The claim's items of this product in one call where that reads each weight once: a
        // kernel then sees runs of rows longer than an item (Q1_0's shares its table loads
        // across 4 groups of 16). With several tokens a row-major kernel reads its rows once per
        // token, so there each item stays a call of its own, meeting every token while in cache.
        const bool run = p->n_tokens == 1 || p->w->layout == MatrixLayout::kInterleaved16;
        const int64_t stop = run ? std::min(end, p + 1 < last ? p[1].first_item : end) : b + 1;
        const int64_t r0 = (b - p->first_item) * kRowsPerItem;
        ProductItem(*p, r0, std::min(p->w->rows, (stop - p->first_item) * kRowsPerItem));
        b = stop;
      }
      b = next.load(std::memory_order_relaxed);
    }
  });
}

// The quantised activation of x [n_tokens][cols] for kernels k: made once per call and distinct
// activation_offsets function among its products (the codes, scales and sums are the same for
// every type; only the offsets the kernels start from differ), in the calling thread's scratch.
struct ActivationCache {
  // Per calling thread, reused across calls; a deque, so growing it keeps the activations already
  // handed out where they are.
  std::deque<QuantizedActivation>& scratch;
  std::vector<decltype(WeightKernels::activation_offsets)> offsets_of{};  // [scratch used]

  const QuantizedActivation* For(const WeightKernels& k, const float* x, int64_t cols,
                                 int64_t n_tokens) {
    size_t i = 0;
    while (i < offsets_of.size() && offsets_of[i] != k.activation_offsets) ++i;
    if (i == offsets_of.size()) {
      offsets_of.push_back(k.activation_offsets);
      if (scratch.size() <= i) scratch.resize(i + 1);
      QuantizeActivationFor(k, x, cols, n_tokens, &scratch[i]);
    }
    return &scratch[i];  // the caller's, not each worker's thread_local
  }
};

}  // namespace

void MatMulGroup(std::span<const MatMulOutput> products, const float* x, int64_t n_tokens,
                 ThreadPool& pool) {
  if (n_tokens <= 0 || products.empty()) return;
  if (products.size() > kMaxMatMulGroup) {  // a caller bug: the group's scratch is fixed
    fmt::print(stderr, "kvq: MatMulGroup: {} products, at most {}\n", products.size(),
               kMaxMatMulGroup);
    std::abort();
  }
  InitDispatch();
  // Per calling thread, reused across calls (a decode step makes a few groups per layer; none
  // should allocate once the sizes have been seen).
  thread_local std::deque<QuantizedActivation> scratch;
  ActivationCache activations{scratch};
  std::array<GroupProduct, kMaxMatMulGroup> group;
  size_t n_products = 0;
  int64_t items = 0, work = 0;  // row items in all; multiply-adds in all
  for (const MatMulOutput& out : products) {
    const Matrix& w = *out.w;
    if (w.rows <= 0) continue;
    if (n_products > 0 && w.cols != group[0].w->cols) {  // a caller bug: one input, so one width
      fmt::print(stderr, "kvq: MatMulGroup: a product has {} columns, the first {}\n", w.cols,
                 group[0].w->cols);
      std::abort();
    }
    const WeightTypeDesc& desc = DescOrDie("MatMulGroup", w.type);
    GroupProduct& p = group[n_products++];
    p = {.w = &w,
         .y = out.y,
         .k = &desc.kernels(),
         .x = x,
         .n_tokens = n_tokens,
         .first_item = items};
    if (desc.quantized_activation) p.s = activations.For(*p.k, x, w.cols, n_tokens);
    items += (w.rows + kRowsPerItem - 1) / kRowsPerItem;
    work += w.rows * w.cols * n_tokens;
  }
  RunProducts(std::span<const GroupProduct>(group.data(), n_products), items, work, pool);
}

void MatMulRuns(std::span<const MatMulRun> runs, const float* x, int64_t n_tokens,
                ThreadPool& pool) {
  if (n_tokens <= 0 || runs.empty()) return;
  InitDispatch();
  thread_local std::deque<QuantizedActivation> scratch;  // as MatMulGroup's
  thread_local std::vector<GroupProduct> products;       // [runs with work]
  ActivationCache activations{scratch};
  products.clear();
  int64_t items = 0, work = 0;  // row items in all; multiply-adds in all
  for (const MatMulRun& run : runs) {
    const Matrix& w = *run.w;
    if (w.rows <= 0 || run.n_tokens <= 0) continue;
    if (!products.empty() &&
        w.cols != products[0].w->cols) {  // a caller bug: one input, so one width
      fmt::print(stderr, "kvq: MatMulRuns: a product has {} columns, the first {}\n", w.cols,
                 products[0].w->cols);
      std::abort();
    }
    if (run.first_token < 0 || run.first_token + run.n_tokens > n_tokens) {  // a caller bug
      fmt::print(stderr, "kvq: MatMulRuns: tokens [{}, {}) outside the input's {}\n",
                 run.first_token, run.first_token + run.n_tokens, n_tokens);
      std::abort();
    }
    const WeightTypeDesc& desc = DescOrDie("MatMulRuns", w.type);
    GroupProduct p{.w = &w,
                   .y = run.y,
                   .k = &desc.kernels(),
                   .x = x + run.first_token * w.cols,
                   .token0 = run.first_token,
                   .n_tokens = run.n_tokens,
                   .first_item = items};
    if (desc.quantized_activation) p.s = activations.For(*p.k, x, w.cols, n_tokens);
    products.push_back(p);
    items += (w.rows + kRowsPerItem - 1) / kRowsPerItem;
    work += w.rows * w.cols * run.n_tokens;
  }
  RunProducts(products, items, work, pool);
}

void MatMul(const Matrix& w, const float* x, int64_t n_tokens, float* y, ThreadPool& pool) {
  const MatMulOutput one{.w = &w, .y = y};
  MatMulGroup(std::span<const MatMulOutput>(&one, 1), x, n_tokens, pool);
}

void MatVec(const Matrix& w, const float* x, float* y, ThreadPool& pool) { MatMul(w, x, 1, y, pool); }

QuantizedX QuantizedActivation::Token(int64_t token) const {
  return {.q = q.data() + token * cols, .d = d.data() + token * (cols / kActivationBlockElems),
          .sum = sum.data() + token * (cols / kActivationBlockElems),
          .offset = offset.data() + token * offset_stride};
}

void QuantizeActivationFor(const WeightKernels& k, const float* x, int64_t cols, int64_t n_tokens,
                           QuantizedActivation* out) {
  InitDispatch();
  const int64_t n = cols * n_tokens;  // tokens back to back: whole blocks, one pass over all
  out->cols = cols;
  out->q.resize(n);
  out->d.resize(n / kActivationBlockElems);
  out->sum.resize(n / kActivationBlockElems);
  out->offset_stride = cols / kActivationLaneElems * k.offset_bytes_per_elem;
  out->offset.resize(n_tokens * out->offset_stride);
  HWY_DYNAMIC_DISPATCH(QuantizeActivationHere)(x, n, out->q.data(), out->d.data());
  for (int64_t b = 0; b < n / kActivationBlockElems; ++b) {
    int32_t sum = 0;
    for (int64_t i = 0; i < kActivationBlockElems; ++i) sum += out->q[b * kActivationBlockElems + i];
    out->sum[b] = sum;
  }
  for (int64_t token = 0; token < n_tokens; ++token) {  // per token: a layout may group a row's blocks
    k.activation_offsets(out->q.data() + token * cols, cols, out->offset.data() + token * out->offset_stride);
  }
}

void QuantizeActivation(const float* x, int64_t cols, int8_t* q, float* d) {
  InitDispatch();
  HWY_DYNAMIC_DISPATCH(QuantizeActivationHere)(x, cols, q, d);
}

const char* MatVecTargetName() { return HWY_DYNAMIC_DISPATCH(MatVecTargetNameHere)(); }

}  // namespace kvq
#endif  // HWY_ONCE
