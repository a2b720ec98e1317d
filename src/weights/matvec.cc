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

#include <atomic>
#include <cstdlib>
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

// Calls fn(r0, r1) for each item of kRowsPerItem rows of [0, rows), on t threads (inline when
// t ≤ 1; MatMul relies on items to keep a block of rows in cache for all its tokens). Items are
// handed out from a shared counter rather than split into fixed runs: on a loaded machine a worker
// that wakes late finds most items done by the threads already running, instead of the others
// waiting while it does a fixed share. Which thread computes an item does not change a bit: every
// item is the same kernel call on the same rows.
template <class F>
void ForEachRowItem(int64_t rows, int32_t t, const F& fn) {
  const int64_t items = (rows + kRowsPerItem - 1) / kRowsPerItem;
  if (t <= 1 || items <= 1) {
    for (int64_t b = 0; b < items; ++b) fn(b * kRowsPerItem, std::min<int64_t>(rows, (b + 1) * kRowsPerItem));
    return;
  }
  // The job captures one pointer, so std::function holds it in place instead of allocating per call
  // (a batched decode step makes seven threaded products per layer).
  struct Job {
    std::atomic<int64_t> next{0};
    int64_t rows, items;
    const F* fn;
  } job{.rows = rows, .items = items, .fn = &fn};
  ThreadPool::Shared(t).Run(t, [j = &job](int64_t, int32_t) {
    for (int64_t b = j->next.fetch_add(1, std::memory_order_relaxed); b < j->items;
         b = j->next.fetch_add(1, std::memory_order_relaxed)) {
      (*j->fn)(b * kRowsPerItem, std::min<int64_t>(j->rows, (b + 1) * kRowsPerItem));
    }
  });
}

// Rows [r0, r1) of a kInterleaved16 matrix for n_tokens tokens: the 16-row groups by the
// interleaved kernel, the rows % 8 plain tail rows by the row kernel, token by token.
void InterleavedItem(const WeightKernels& k, const Matrix& w, const QuantizedActivation& s, int64_t n_tokens,
                     float* y, int64_t r0, int64_t r1) {
  const int64_t grouped = w.rows / kInterleaveRows * kInterleaveRows;  // rows in 16-row groups
  const int64_t g1 = std::min(r1, grouped);
  if (r0 < g1) k.interleaved_rows(w.data, s.Token(0), n_tokens, y, w.rows, w.cols, r0, g1);
  if (std::max(r0, grouped) < r1) {
    for (int64_t j = 0; j < n_tokens; ++j) {
      k.quant_rows(w.data, s.Token(j), y + j * w.rows, w.cols, std::max(r0, grouped), r1);
    }
  }
}

}  // namespace

void MatVec(const Matrix& w, const float* x, float* y, int32_t threads) {
  if (w.rows <= 0) return;
  InitDispatch();
  const WeightTypeDesc& desc = DescOrDie("MatVec", w.type);
  const WeightKernels& k = desc.kernels();
  const int32_t t = w.rows * w.cols >= (1 << 16) ? threads : 1;
  if (desc.quantized_activation) {
    const auto rows_fn = k.quant_rows;
    // Per calling thread, reused across calls (a decode step makes seven MatVec calls per layer;
    // none should allocate once the sizes have been seen).
    thread_local QuantizedActivation s;
    QuantizeActivationFor(k, x, w.cols, 1, &s);
    if (w.layout == MatrixLayout::kInterleaved16) {
      const QuantizedActivation& qa = s;  // the caller's, not each worker's thread_local
      ForEachRowItem(w.rows, t, [&](int64_t r0, int64_t r1) { InterleavedItem(k, w, qa, 1, y, r0, r1); });
      return;
    }
    const QuantizedX qx = s.Token(0);
    ForEachRowItem(w.rows, t, [&](int64_t r0, int64_t r1) { rows_fn(w.data, qx, y, w.cols, r0, r1); });
    return;
  }
  const auto rows_fn = k.rows;
  ForEachRowItem(w.rows, t, [&](int64_t r0, int64_t r1) { rows_fn(w.data, x, y, w.cols, r0, r1); });
}

void MatMul(const Matrix& w, const float* x, int64_t n_tokens, float* y, int32_t threads) {
  if (w.rows <= 0 || n_tokens <= 0) return;
  InitDispatch();
  const WeightTypeDesc& desc = DescOrDie("MatMul", w.type);
  const WeightKernels& k = desc.kernels();
  // Each item of 16 rows meets every token while those rows are in cache, so the weights are read
  // from memory once per call, not once per token. Per row and token it is MatVec's own kernel on
  // the same quantised activation: the results equal n_tokens MatVec calls bit for bit.
  const int32_t t = w.rows * w.cols * n_tokens >= (1 << 16) ? threads : 1;
  if (desc.quantized_activation) {
    const auto rows_fn = k.quant_rows;
    thread_local QuantizedActivation scratch;
    QuantizeActivationFor(k, x, w.cols, n_tokens, &scratch);
    // A named reference: inside the lambda, `scratch` would be each worker's own thread_local.
    const QuantizedActivation& s = scratch;
    if (w.layout == MatrixLayout::kInterleaved16) {
      // Per row and token the interleaved kernel does the same operations whatever n_tokens (it
      // steps 16 rows × up to 4 tokens), so this equals n_tokens MatVec calls bit for bit.
      ForEachRowItem(w.rows, t, [&](int64_t r0, int64_t r1) { InterleavedItem(k, w, s, n_tokens, y, r0, r1); });
      return;
    }
    ForEachRowItem(w.rows, t, [&](int64_t r0, int64_t r1) {
      for (int64_t j = 0; j < n_tokens; ++j) {
        rows_fn(w.data, s.Token(j), y + j * w.rows, w.cols, r0, r1);
      }
    });
    return;
  }
  const auto rows_fn = k.rows;
  ForEachRowItem(w.rows, t, [&](int64_t r0, int64_t r1) {
    for (int64_t j = 0; j < n_tokens; ++j) rows_fn(w.data, x + j * w.cols, y + j * w.rows, w.cols, r0, r1);
  });
}

QuantizedX QuantizedActivation::Token(int64_t token) const {
  return {.q = q.data() + token * cols, .d = d.data() + token * (cols / kActivationBlockElems),
          .sum = sum.data() + token * (cols / kActivationBlockElems),
          .offset = offset.data() + token * (cols / kActivationLaneElems)};
}

void QuantizeActivationFor(const WeightKernels& k, const float* x, int64_t cols, int64_t n_tokens,
                           QuantizedActivation* out) {
  InitDispatch();
  const int64_t n = cols * n_tokens;  // tokens back to back: whole blocks, one pass over all
  out->cols = cols;
  out->q.resize(n);
  out->d.resize(n / kActivationBlockElems);
  out->sum.resize(n / kActivationBlockElems);
  out->offset.resize(n / kActivationLaneElems);
  HWY_DYNAMIC_DISPATCH(QuantizeActivationHere)(x, n, out->q.data(), out->d.data());
  for (int64_t b = 0; b < n / kActivationBlockElems; ++b) {
    int32_t sum = 0;
    for (int64_t i = 0; i < kActivationBlockElems; ++i) sum += out->q[b * kActivationBlockElems + i];
    out->sum[b] = sum;
  }
  for (int64_t token = 0; token < n_tokens; ++token) {  // per token: a layout may group a row's blocks
    k.activation_offsets(out->q.data() + token * cols, cols, out->offset.data() + token * (cols / kActivationLaneElems));
  }
}

void QuantizeActivation(const float* x, int64_t cols, int8_t* q, float* d) {
  InitDispatch();
  HWY_DYNAMIC_DISPATCH(QuantizeActivationHere)(x, cols, q, d);
}

const char* MatVecTargetName() { return HWY_DYNAMIC_DISPATCH(MatVecTargetNameHere)(); }

}  // namespace kvq
#endif  // HWY_ONCE
