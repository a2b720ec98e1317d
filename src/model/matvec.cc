// MatVec (see matvec.h): per-target row kernels (foreach_target), the threaded driver, and the
// scalar decoders and reference.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "model/matvec.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>
#include <cstring>

#include "base/float_codes.h"
#include "model/matvec.h"

#ifndef KVQ_MODEL_MATVEC_CONSTANTS_
#define KVQ_MODEL_MATVEC_CONSTANTS_
namespace kvq::matvec_internal {

constexpr int64_t kBlockElems = 32;  // Q8_0 and Q4_0: elements per block
constexpr int64_t kQ8Bytes = 34;     // f16 d + 32 int8
constexpr int64_t kQ4Bytes = 18;     // f16 d + 16 bytes of nibbles

inline uint16_t LoadU16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;  // little-endian host (x86-64, AArch64)
}

}  // namespace kvq::matvec_internal
#endif

HWY_BEFORE_NAMESPACE();
namespace kvq {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using matvec_internal::kBlockElems;
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

// ---- Block types (Q8_0, Q4_0): cols a multiple of 32. ----
// Per block and row: bs = Σ code·x over the block's 32 elements (codes are small integers,
// converted exactly to f32), then acc += d·bs — the scale costs one FMA per block, not one per
// element. K = 32 / N vectors of x per block are loaded once and shared by the rows.

struct Q8Blocks {
  static constexpr int64_t kBytes = matvec_internal::kQ8Bytes;
  template <class D, int K>
  static HWY_INLINE hn::Vec<D> Dot(D d, const uint8_t* qs, const hn::Vec<D>* xv) {
    constexpr int64_t kN = static_cast<int64_t>(hn::MaxLanes(D()));
    const hn::Rebind<int8_t, D> di8;
    const hn::Rebind<int32_t, D> di32;
    const auto* q = reinterpret_cast<const int8_t*>(qs);
    auto bs = hn::Mul(hn::ConvertTo(d, hn::PromoteTo(di32, hn::LoadU(di8, q))), xv[0]);
    for (int k = 1; k < K; ++k) {
      bs = hn::MulAdd(hn::ConvertTo(d, hn::PromoteTo(di32, hn::LoadU(di8, q + k * kN))), xv[k], bs);
    }
    return bs;
  }
};

struct Q4Blocks {
  static constexpr int64_t kBytes = matvec_internal::kQ4Bytes;
  // Bytes j .. j+N-1 hold elements j .. j+N-1 (low nibbles) and j+16 .. j+16+N-1 (high nibbles).
  // A nibble n becomes a float without a conversion instruction: the bits 0x4B000000 | n are the
  // f32 2^23 + n, and subtracting 2^23 + 8 leaves n − 8 exactly (Sterbenz).
  template <class D, int K>
  static HWY_INLINE hn::Vec<D> Dot(D d, const uint8_t* qs, const hn::Vec<D>* xv) {
    constexpr int64_t kN = static_cast<int64_t>(hn::MaxLanes(D()));
    const hn::Rebind<uint8_t, D> du8;
    const hn::Rebind<uint32_t, D> du32;
    const auto mask = hn::Set(du32, 0x0F);
    const auto two23 = hn::Set(du32, 0x4B000000u);
    const auto bias = hn::Set(d, 8388616.0f);  // 2^23 + 8
    auto bs = hn::Zero(d);
    for (int k = 0; k < K / 2; ++k) {
      const auto bytes = hn::PromoteTo(du32, hn::LoadU(du8, qs + k * kN));
      const auto lo = hn::Sub(hn::BitCast(d, hn::OrAnd(two23, bytes, mask)), bias);
      const auto hi = hn::Sub(hn::BitCast(d, hn::Or(two23, hn::ShiftRight<4>(bytes))), bias);
      bs = hn::MulAdd(lo, xv[k], bs);
      bs = hn::MulAdd(hi, xv[K / 2 + k], bs);
    }
    return bs;
  }
};

template <class B, int R>
HWY_INLINE void BlockRowGroup(const uint8_t* w, const float* x, float* y, int64_t cols, int64_t r) {
  using D = hn::CappedTag<float, 16>;  // N ∈ {1, 2, 4, 8, 16} divides 16: a block is 32/N vectors
  const D d;
  const hn::Rebind<hwy::float16_t, D> df16;
  constexpr int kN = static_cast<int>(hn::MaxLanes(D()));
  constexpr int kK = static_cast<int>(kBlockElems) / kN;
  static_assert(kK >= 2 && kK * kN == kBlockElems);
  // Scales are converted a chunk of kChunk blocks at a time per row (gathered to a small array,
  // converted with the target's f16 instruction, N at a time) so the block loop reads each one
  // with a broadcast from memory instead of spending vector-port work per block on it.
  constexpr int64_t kChunk = 16;
  const int64_t n_blocks = cols / kBlockElems;
  const int64_t row_bytes = n_blocks * B::kBytes;
  const uint8_t* a[R];
  hn::Vec<D> acc[R];
  for (int i = 0; i < R; ++i) {
    a[i] = w + (r + i) * row_bytes;
    acc[i] = hn::Zero(d);
  }
  for (int64_t b0 = 0; b0 < n_blocks; b0 += kChunk) {
    const int64_t nb = std::min(kChunk, n_blocks - b0);
    hwy::float16_t half[R][kChunk];
    float scale[R][kChunk];
    for (int i = 0; i < R; ++i) {
      for (int64_t j = 0; j < nb; ++j) std::memcpy(&half[i][j], a[i] + (b0 + j) * B::kBytes, 2);
      if (nb % kN != 0) std::memset(&half[i][nb], 0, (kChunk - nb) * sizeof(half[i][0]));  // unused lanes
      for (int64_t j = 0; j < nb; j += kN) {
        hn::StoreU(hn::PromoteTo(d, hn::LoadU(df16, &half[i][j])), d, &scale[i][j]);
      }
    }
    for (int64_t j = 0; j < nb; ++j) {
      const int64_t b = b0 + j;
      hn::Vec<D> xv[kK];
      for (int k = 0; k < kK; ++k) xv[k] = hn::LoadU(d, x + b * kBlockElems + k * kN);
      for (int i = 0; i < R; ++i) {
        const auto bs = B::template Dot<D, kK>(d, a[i] + b * B::kBytes + 2, xv);
        acc[i] = hn::MulAdd(hn::Set(d, scale[i][j]), bs, acc[i]);
      }
    }
  }
  for (int i = 0; i < R; ++i) y[r + i] = hn::GetLane(hn::SumOfLanes(d, acc[i]));
}

template <class B>
HWY_INLINE void BlockRows(const uint8_t* w, const float* x, float* y, int64_t cols, int64_t r0,
                          int64_t r1) {
  int64_t r = r0;
  for (; r + 4 <= r1; r += 4) BlockRowGroup<B, 4>(w, x, y, cols, r);
  for (; r < r1; ++r) BlockRowGroup<B, 1>(w, x, y, cols, r);
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
void MatVecQ8Rows(const uint8_t* w, const float* x, float* y, int64_t cols, int64_t r0, int64_t r1) {
  BlockRows<Q8Blocks>(w, x, y, cols, r0, r1);
}
void MatVecQ4Rows(const uint8_t* w, const float* x, float* y, int64_t cols, int64_t r0, int64_t r1) {
  BlockRows<Q4Blocks>(w, x, y, cols, r0, r1);
}

const char* MatVecTargetNameHere() { return hwy::TargetName(HWY_TARGET); }

}  // namespace HWY_NAMESPACE
}  // namespace kvq
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <vector>

#include "base/thread_pool.h"

namespace kvq {

using matvec_internal::kBlockElems;
using matvec_internal::kQ4Bytes;
using matvec_internal::kQ8Bytes;
using matvec_internal::LoadU16;

HWY_EXPORT(MatVecF32Rows);
HWY_EXPORT(MatVecF16Rows);
HWY_EXPORT(MatVecBf16Rows);
HWY_EXPORT(MatVecQ8Rows);
HWY_EXPORT(MatVecQ4Rows);
HWY_EXPORT(MatVecTargetNameHere);

const char* WeightTypeName(WeightType type) {
  switch (type) {
    case WeightType::kF32: return "F32";
    case WeightType::kF16: return "F16";
    case WeightType::kBf16: return "BF16";
    case WeightType::kQ8_0: return "Q8_0";
    case WeightType::kQ4_0: return "Q4_0";
  }
  return "?";
}

namespace {

bool IsBlockType(WeightType type) { return type == WeightType::kQ8_0 || type == WeightType::kQ4_0; }

bool IsKnownType(WeightType type) {
  switch (type) {
    case WeightType::kF32:
    case WeightType::kF16:
    case WeightType::kBf16:
    case WeightType::kQ8_0:
    case WeightType::kQ4_0: return true;
  }
  return false;
}

using RowsFn = void (*)(const uint8_t*, const float*, float*, int64_t, int64_t, int64_t);

// Resolves the dispatch once, in the calling thread, so the pool's workers never run Highway's
// first-call target selection concurrently.
RowsFn PickRows(WeightType type) {
  if (!hwy::GetChosenTarget().IsInitialized()) hwy::GetChosenTarget().Update(hwy::SupportedTargets());
  switch (type) {
    case WeightType::kF32: return HWY_DYNAMIC_DISPATCH(MatVecF32Rows);
    case WeightType::kF16: return HWY_DYNAMIC_DISPATCH(MatVecF16Rows);
    case WeightType::kBf16: return HWY_DYNAMIC_DISPATCH(MatVecBf16Rows);
    case WeightType::kQ8_0: return HWY_DYNAMIC_DISPATCH(MatVecQ8Rows);
    case WeightType::kQ4_0: return HWY_DYNAMIC_DISPATCH(MatVecQ4Rows);
  }
  return nullptr;
}

}  // namespace

Status CheckMatrix(const Matrix& w) {
  if (!IsKnownType(w.type)) {
    return Status::Error(fmt::format(
        "weight type id {} is not supported (supported: F32, F16, BF16, Q8_0, Q4_0)",
        static_cast<int>(w.type)));
  }
  if (w.rows < 0 || w.cols < 1) {
    return Status::Error(fmt::format("{} matrix has shape [{}][{}]; expected rows >= 0 and cols >= 1",
                                     WeightTypeName(w.type), w.rows, w.cols));
  }
  if (IsBlockType(w.type) && w.cols % kBlockElems != 0) {
    return Status::Error(fmt::format(
        "{} matrix has {} columns, which is not a multiple of 32: {} stores each row as blocks of 32 "
        "elements", WeightTypeName(w.type), w.cols, WeightTypeName(w.type)));
  }
  return Status::Ok();
}

int64_t MatrixRowBytes(WeightType type, int64_t cols) {
  switch (type) {
    case WeightType::kF32: return cols * 4;
    case WeightType::kF16:
    case WeightType::kBf16: return cols * 2;
    case WeightType::kQ8_0: return cols / kBlockElems * kQ8Bytes;
    case WeightType::kQ4_0: return cols / kBlockElems * kQ4Bytes;
  }
  return 0;
}

void MatVec(const Matrix& w, const float* x, float* y, int32_t threads) {
  if (w.rows <= 0) return;
  const RowsFn rows_fn = PickRows(w.type);
  if (rows_fn == nullptr) {  // CheckMatrix refuses such a matrix; reaching here is a caller bug
    fmt::print(stderr, "kvq: MatVec: weight type id {} is not supported\n", static_cast<int>(w.type));
    std::abort();
  }
  // Blocks of 16 rows so small matrices stay on one thread and work splits evenly otherwise.
  const int64_t blocks = (w.rows + 15) / 16;
  const int32_t t = w.rows * w.cols >= (1 << 16) ? threads : 1;
  if (t <= 1) {
    rows_fn(w.data, x, y, w.cols, 0, w.rows);
    return;
  }
  ThreadPool::Shared(t).Run(blocks, [&](int64_t b, int32_t) {
    rows_fn(w.data, x, y, w.cols, b * 16, std::min<int64_t>(w.rows, (b + 1) * 16));
  });
}

void MatMul(const Matrix& w, const float* x, int64_t n_tokens, float* y, int32_t threads) {
  if (w.rows <= 0 || n_tokens <= 0) return;
  const RowsFn rows_fn = PickRows(w.type);
  if (rows_fn == nullptr) {  // CheckMatrix refuses such a matrix; reaching here is a caller bug
    fmt::print(stderr, "kvq: MatMul: weight type id {} is not supported\n", static_cast<int>(w.type));
    std::abort();
  }
  // Each block of 16 rows meets every token while those rows are in cache, so the weights are read
  // from memory once per call, not once per token. Per row and token it is MatVec's own kernel:
  // the results equal n_tokens MatVec calls bit for bit.
  const int64_t blocks = (w.rows + 15) / 16;
  const int32_t t = w.rows * w.cols * n_tokens >= (1 << 16) ? threads : 1;
  ThreadPool::Shared(std::max(1, t)).Run(blocks, [&](int64_t b, int32_t) {
    const int64_t r0 = b * 16, r1 = std::min<int64_t>(w.rows, (b + 1) * 16);
    for (int64_t k = 0; k < n_tokens; ++k) rows_fn(w.data, x + k * w.cols, y + k * w.rows, w.cols, r0, r1);
  });
}

float DecodeWeight(const Matrix& w, int64_t row, int64_t col) {
  const uint8_t* p = w.data + row * MatrixRowBytes(w.type, w.cols);
  switch (w.type) {
    case WeightType::kF32: {
      float v;
      std::memcpy(&v, p + 4 * col, 4);
      return v;
    }
    case WeightType::kF16: return F16ToF32(LoadU16(p + 2 * col));
    case WeightType::kBf16: return Bf16ToF32(LoadU16(p + 2 * col));
    case WeightType::kQ8_0: {
      const uint8_t* block = p + (col / kBlockElems) * kQ8Bytes;
      const int64_t i = col % kBlockElems;
      return F16ToF32(LoadU16(block)) * static_cast<float>(static_cast<int8_t>(block[2 + i]));
    }
    case WeightType::kQ4_0: {
      const uint8_t* block = p + (col / kBlockElems) * kQ4Bytes;
      const int64_t i = col % kBlockElems;
      const uint8_t byte = block[2 + i % 16];
      const int code = (i < 16 ? (byte & 0x0F) : (byte >> 4)) - 8;
      return F16ToF32(LoadU16(block)) * static_cast<float>(code);
    }
  }
  return 0.0f;
}

void DecodeWeightRow(const Matrix& w, int64_t row, float* out) {
  for (int64_t c = 0; c < w.cols; ++c) out[c] = DecodeWeight(w, row, c);
}

void MatVecReference(const Matrix& w, const float* x, float* y) {
  if (w.type == WeightType::kF32) {  // no copy needed (the reference forward pass calls this)
    const auto* a = reinterpret_cast<const float*>(w.data);
    for (int64_t r = 0; r < w.rows; ++r) {
      float sum = 0.0f;
      for (int64_t c = 0; c < w.cols; ++c) sum += a[r * w.cols + c] * x[c];
      y[r] = sum;
    }
    return;
  }
  std::vector<float> row(w.cols);
  for (int64_t r = 0; r < w.rows; ++r) {
    DecodeWeightRow(w, r, row.data());
    float sum = 0.0f;
    for (int64_t c = 0; c < w.cols; ++c) sum += row[c] * x[c];
    y[r] = sum;
  }
}

const char* MatVecTargetName() { return HWY_DYNAMIC_DISPATCH(MatVecTargetNameHere)(); }

}  // namespace kvq
#endif
