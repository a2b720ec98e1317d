// The plain-C++ side of MatVec (see matvec.h): shape checks, scalar decoders, and the references
// the SIMD kernels are tested against. Nothing here is vectorised on purpose: these are oracles.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "base/float_codes.h"
#include "weights/matvec.h"
#include "weights/matvec_internal.h"

namespace kvq {

using matvec_internal::kBlockElems;
using matvec_internal::kQ4Bytes;
using matvec_internal::kQ8Bytes;
using matvec_internal::LoadU16;

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

// The block of `row` holding element `block`·32 (Q8_0/Q4_0).
const uint8_t* BlockAt(const Matrix& w, int64_t row, int64_t block) {
  const int64_t block_bytes = w.type == WeightType::kQ8_0 ? kQ8Bytes : kQ4Bytes;
  return w.data + row * MatrixRowBytes(w.type, w.cols) + block * block_bytes;
}

// Code i (0 ≤ i < 32) of a Q8_0/Q4_0 block: the int8, or the nibble − 8.
int32_t BlockCode(WeightType type, const uint8_t* block, int64_t i) {
  if (type == WeightType::kQ8_0) return static_cast<int8_t>(block[2 + i]);
  const uint8_t byte = block[2 + i % 16];
  return (i < 16 ? (byte & 0x0F) : (byte >> 4)) - 8;
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
    case WeightType::kQ8_0:
    case WeightType::kQ4_0: {
      const uint8_t* block = BlockAt(w, row, col / kBlockElems);
      return F16ToF32(LoadU16(block)) * static_cast<float>(BlockCode(w.type, block, col % kBlockElems));
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

void QuantizeActivationReference(const float* x, int64_t cols, int8_t* q, float* d) {
  for (int64_t b = 0; b < cols / kBlockElems; ++b) {
    const float* xb = x + b * kBlockElems;
    int8_t* qb = q + b * kBlockElems;
    float amax = 0.0f;
    bool finite = true;
    for (int64_t i = 0; i < kBlockElems; ++i) {
      finite = finite && std::isfinite(xb[i]);
      amax = std::max(amax, std::fabs(xb[i]));
    }
    const float scale = finite ? amax / 127.0f : std::numeric_limits<float>::quiet_NaN();
    d[b] = scale;
    for (int64_t i = 0; i < kBlockElems; ++i) {
      qb[i] = !finite || scale == 0.0f
                  ? 0
                  : static_cast<int8_t>(std::nearbyint(std::clamp(xb[i] / scale, -127.0f, 127.0f)));
    }
  }
}

int32_t BlockDotReference(const Matrix& w, int64_t row, int64_t block, const int8_t* q) {
  const uint8_t* p = BlockAt(w, row, block);
  int32_t dot = 0;
  for (int64_t i = 0; i < kBlockElems; ++i) dot += BlockCode(w.type, p, i) * q[block * kBlockElems + i];
  return dot;
}

void MatVecQuantizedReference(const Matrix& w, const float* x, QuantizedProductReference* out) {
  if (!IsBlockType(w.type)) {
    fmt::print(stderr, "kvq: MatVecQuantizedReference: {} is not a block type\n", WeightTypeName(w.type));
    std::abort();
  }
  const int64_t n_blocks = w.cols / kBlockElems;
  std::vector<int8_t> q(w.cols);
  std::vector<float> d(n_blocks);
  QuantizeActivationReference(x, w.cols, q.data(), d.data());
  constexpr double kXError = 0.5 + 0x1p-17;  // per element, in units of d_x (matvec.h)
  for (int64_t r = 0; r < w.rows; ++r) {
    QuantizedProductReference& o = out[r];
    o = {};
    for (int64_t b = 0; b < n_blocks; ++b) {
      const uint8_t* p = BlockAt(w, r, b);
      const double dw = F16ToF32(LoadU16(p));
      const double s = dw * d[b];  // exact: 11 × 24 significant bits
      int64_t abs_codes = 0, abs_weights = 0;  // Σ|code·q|, Σ|code|
      for (int64_t i = 0; i < kBlockElems; ++i) {
        const int32_t code = BlockCode(w.type, p, i);
        abs_codes += std::abs(code * q[b * kBlockElems + i]);
        abs_weights += std::abs(code);
      }
      o.y += s * BlockDotReference(w, r, b, q.data());
      o.abs_sum += std::fabs(s) * static_cast<double>(abs_codes);
      o.x_error_bound +=
          static_cast<double>(d[b]) * kXError * std::fabs(dw) * static_cast<double>(abs_weights);
    }
  }
}

}  // namespace kvq
