// MatVec (see matvec.h): the per-target row kernels (foreach_target) and the threaded driver. The
// plain types' kernels are below; the quantised-activation path (Q8_0, Q4_0) is in
// matvec_quant-inl.h; the scalar decoders and references are in matvec_reference.cc.
//
// AVX3_DL (AVX-512 with VNNI) is compiled in this translation unit only: the Q8_0/Q4_0 kernels use
// its vpdpbusd. The plain types' kernels are the same Highway code on AVX3 and AVX3_DL (the same
// float instructions in the same order), so they give AVX3's bits there.
#ifndef HWY_WANT_AVX3_DL
#define HWY_WANT_AVX3_DL
#endif
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "weights/matvec.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>
#include <cstring>

#include "base/float_codes.h"
#include "weights/matvec.h"
#include "weights/matvec_internal.h"
#include "weights/matvec_quant-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kvq {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using matvec_internal::LoadU16;

// ---- Plain element types (F32, F16, BF16): any cols; full vectors, a scalar tail. ----

struct F32Elems {
  static constexpr int64_t kBytes = 4;
  template <class D>
  static HWY_INLINE hn::Vec<D> Load(D d, const uint8_t* row, int64_t c) {
    return hn::LoadU(d, reinterpret_cast<const float*>(row) + c);
  }
  static HWY_INLINE float Scalar(const uint8_t* row, int64_t c) {
    float v;
    std::memcpy(&v, row + 4 * c, 4);
    return v;
  }
};

struct F16Elems {
  static constexpr int64_t kBytes = 2;
  template <class D>
  static HWY_INLINE hn::Vec<D> Load(D d, const uint8_t* row, int64_t c) {
    const hn::Rebind<hwy::float16_t, D> df16;
    return hn::PromoteTo(d, hn::LoadU(df16, reinterpret_cast<const hwy::float16_t*>(row) + c));
  }
  static HWY_INLINE float Scalar(const uint8_t* row, int64_t c) { return F16ToF32(LoadU16(row + 2 * c)); }
};

struct Bf16Elems {
  static constexpr int64_t kBytes = 2;
  template <class D>
  static HWY_INLINE hn::Vec<D> Load(D d, const uint8_t* row, int64_t c) {
    const hn::Rebind<uint16_t, D> du16;
    const hn::Rebind<uint32_t, D> du32;
    const auto bits = hn::PromoteTo(du32, hn::LoadU(du16, reinterpret_cast<const uint16_t*>(row) + c));
    return hn::BitCast(d, hn::ShiftLeft<16>(bits));  // a bf16 is the top half of an f32
  }
  static HWY_INLINE float Scalar(const uint8_t* row, int64_t c) { return Bf16ToF32(LoadU16(row + 2 * c)); }
};

// R consecutive rows from r, sharing each load of x.
template <class E, int R>
HWY_INLINE void PlainRowGroup(const uint8_t* w, const float* x, float* y, int64_t cols, int64_t r) {
  const hn::ScalableTag<float> d;
  const int64_t n = static_cast<int64_t>(hn::Lanes(d));
  const int64_t row_bytes = cols * E::kBytes;
  const uint8_t* a[R];
  hn::Vec<decltype(d)> s[R];
  for (int i = 0; i < R; ++i) {
    a[i] = w + (r + i) * row_bytes;
    s[i] = hn::Zero(d);
  }
  int64_t c = 0;
  for (; c + n <= cols; c += n) {
    const auto xv = hn::LoadU(d, x + c);
    for (int i = 0; i < R; ++i) s[i] = hn::MulAdd(E::Load(d, a[i], c), xv, s[i]);
  }
  float t[R];
  for (int i = 0; i < R; ++i) t[i] = hn::GetLane(hn::SumOfLanes(d, s[i]));
  for (; c < cols; ++c) {
    for (int i = 0; i < R; ++i) t[i] += E::Scalar(a[i], c) * x[c];
  }
  for (int i = 0; i < R; ++i) y[r + i] = t[i];
}

template <class E>
HWY_INLINE void PlainRows(const uint8_t* w, const float* x, float* y, int64_t cols, int64_t r0,
                          int64_t r1) {
  int64_t r = r0;
  for (; r + 4 <= r1; r += 4) PlainRowGroup<E, 4>(w, x, y, cols, r);
  for (; r < r1; ++r) PlainRowGroup<E, 1>(w, x, y, cols, r);
}

// Rows [r0, r1) of y = W x, one exported entry point per weight type (same signature).
void MatVecF32Rows(const uint8_t* w, const float* x, float* y, int64_t cols, int64_t r0, int64_t r1) {
  PlainRows<F32Elems>(w, x, y, cols, r0, r1);
}
void MatVecF16Rows(const uint8_t* w, const float* x, float* y, int64_t cols, int64_t r0, int64_t r1) {
  PlainRows<F16Elems>(w, x, y, cols, r0, r1);
}
void MatVecBf16Rows(const uint8_t* w, const float* x, float* y, int64_t cols, int64_t r0, int64_t r1) {
  PlainRows<Bf16Elems>(w, x, y, cols, r0, r1);
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

using matvec_internal::kBlockElems;
using matvec_internal::kLaneElems;
using matvec_internal::QuantizedX;

HWY_EXPORT(MatVecF32Rows);
HWY_EXPORT(MatVecF16Rows);
HWY_EXPORT(MatVecBf16Rows);
HWY_EXPORT(MatVecQ8Rows);
HWY_EXPORT(MatVecQ4Rows);
HWY_EXPORT(QuantizeActivationHere);
HWY_EXPORT(PrepareActivationHere);
HWY_EXPORT(MatVecTargetNameHere);

namespace {

using PlainRowsFn = void (*)(const uint8_t*, const float*, float*, int64_t, int64_t, int64_t);
using QuantRowsFn = void (*)(const uint8_t*, const QuantizedX&, float*, int64_t, int64_t, int64_t);

// Dispatch is resolved once per call, in the calling thread, so the pool's workers never run
// Highway's first-call target selection concurrently.
void InitDispatch() {
  if (!hwy::GetChosenTarget().IsInitialized()) hwy::GetChosenTarget().Update(hwy::SupportedTargets());
}

PlainRowsFn PickPlainRows(WeightType type) {
  switch (type) {
    case WeightType::kF32: return HWY_DYNAMIC_DISPATCH(MatVecF32Rows);
    case WeightType::kF16: return HWY_DYNAMIC_DISPATCH(MatVecF16Rows);
    case WeightType::kBf16: return HWY_DYNAMIC_DISPATCH(MatVecBf16Rows);
    default: return nullptr;
  }
}

QuantRowsFn PickQuantRows(WeightType type) {
  switch (type) {
    case WeightType::kQ8_0: return HWY_DYNAMIC_DISPATCH(MatVecQ8Rows);
    case WeightType::kQ4_0: return HWY_DYNAMIC_DISPATCH(MatVecQ4Rows);
    default: return nullptr;
  }
}

[[noreturn]] void Unsupported(const char* what, WeightType type) {
  // CheckMatrix refuses such a matrix; reaching here is a caller bug.
  fmt::print(stderr, "kvq: {}: weight type id {} is not supported\n", what, static_cast<int>(type));
  std::abort();
}

// The activations of one call, quantised: per calling thread, reused across calls (a decode step
// makes seven MatVec calls per layer; none should allocate once the sizes have been seen).
struct ActivationScratch {
  std::vector<int8_t> q;        // [n_tokens][cols]
  std::vector<float> d;         // [n_tokens][cols / 32]
  std::vector<int32_t> offset;  // [n_tokens][cols / 4]
};

// Quantises n_tokens rows of x (tokens back to back: whole blocks, so one pass over all of them)
// and fills the offsets the dispatched target's kernels start from (see QuantizedX).
ActivationScratch& QuantizeTokens(WeightType type, const float* x, int64_t cols, int64_t n_tokens) {
  thread_local ActivationScratch s;
  const int64_t n = cols * n_tokens;
  s.q.resize(n);
  s.d.resize(n / kBlockElems);
  s.offset.resize(n / kLaneElems);
  HWY_DYNAMIC_DISPATCH(PrepareActivationHere)(x, n, type, s.q.data(), s.d.data(), s.offset.data());
  return s;
}

QuantizedX TokenView(const ActivationScratch& s, int64_t cols, int64_t token) {
  return {.q = s.q.data() + token * cols, .d = s.d.data() + token * (cols / kBlockElems),
          .offset = s.offset.data() + token * (cols / kLaneElems)};
}

bool IsBlockType(WeightType type) { return type == WeightType::kQ8_0 || type == WeightType::kQ4_0; }

constexpr int64_t kRowsPerItem = 16;  // rows per work item: small matrices stay on one thread

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
  std::atomic<int64_t> next{0};
  ThreadPool::Shared(t).Run(t, [&](int64_t, int32_t) {
    for (int64_t b = next.fetch_add(1, std::memory_order_relaxed); b < items;
         b = next.fetch_add(1, std::memory_order_relaxed)) {
      fn(b * kRowsPerItem, std::min<int64_t>(rows, (b + 1) * kRowsPerItem));
    }
  });
}

}  // namespace

void MatVec(const Matrix& w, const float* x, float* y, int32_t threads) {
  if (w.rows <= 0) return;
  InitDispatch();
  const int32_t t = w.rows * w.cols >= (1 << 16) ? threads : 1;
  if (IsBlockType(w.type)) {
    const QuantRowsFn rows_fn = PickQuantRows(w.type);
    const ActivationScratch& s = QuantizeTokens(w.type, x, w.cols, 1);
    const QuantizedX qx = TokenView(s, w.cols, 0);
    ForEachRowItem(w.rows, t, [&](int64_t r0, int64_t r1) { rows_fn(w.data, qx, y, w.cols, r0, r1); });
    return;
  }
  const PlainRowsFn rows_fn = PickPlainRows(w.type);
  if (rows_fn == nullptr) Unsupported("MatVec", w.type);
  ForEachRowItem(w.rows, t, [&](int64_t r0, int64_t r1) { rows_fn(w.data, x, y, w.cols, r0, r1); });
}

void MatMul(const Matrix& w, const float* x, int64_t n_tokens, float* y, int32_t threads) {
  if (w.rows <= 0 || n_tokens <= 0) return;
  InitDispatch();
  // Each item of 16 rows meets every token while those rows are in cache, so the weights are read
  // from memory once per call, not once per token. Per row and token it is MatVec's own kernel on
  // the same quantised activation: the results equal n_tokens MatVec calls bit for bit.
  const int32_t t = w.rows * w.cols * n_tokens >= (1 << 16) ? threads : 1;
  if (IsBlockType(w.type)) {
    const QuantRowsFn rows_fn = PickQuantRows(w.type);
    const ActivationScratch& s = QuantizeTokens(w.type, x, w.cols, n_tokens);
    ForEachRowItem(w.rows, t, [&](int64_t r0, int64_t r1) {
      for (int64_t k = 0; k < n_tokens; ++k) {
        rows_fn(w.data, TokenView(s, w.cols, k), y + k * w.rows, w.cols, r0, r1);
      }
    });
    return;
  }
  const PlainRowsFn rows_fn = PickPlainRows(w.type);
  if (rows_fn == nullptr) Unsupported("MatMul", w.type);
  ForEachRowItem(w.rows, t, [&](int64_t r0, int64_t r1) {
    for (int64_t k = 0; k < n_tokens; ++k) rows_fn(w.data, x + k * w.cols, y + k * w.rows, w.cols, r0, r1);
  });
}

void QuantizeActivation(const float* x, int64_t cols, int8_t* q, float* d) {
  InitDispatch();
  HWY_DYNAMIC_DISPATCH(QuantizeActivationHere)(x, cols, q, d);
}

const char* MatVecTargetName() { return HWY_DYNAMIC_DISPATCH(MatVecTargetNameHere)(); }

}  // namespace kvq
#endif  // HWY_ONCE
