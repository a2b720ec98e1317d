// The plain-C++ side of MatVec (see matvec.h): shape checks, scalar decoders, and the references
// the SIMD kernels are tested against. Nothing here is vectorised on purpose: these are oracles.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "weights/matvec.h"
#include "weights/repack.h"
#include "weights/weight_type.h"

namespace kvq {
namespace {

constexpr int64_t kBlockElems = kActivationBlockElems;  // a quantised-activation type's block

// The registry entry of a matrix that passed CheckMatrix (a caller bug otherwise).
const WeightTypeDesc& Desc(const char* what, WeightType type) {
  const WeightTypeDesc* d = FindWeightType(type);
  if (d == nullptr) {
    fmt::print(stderr, "kvq: {}: weight type id {} is not supported\n", what, static_cast<int>(type));
    std::abort();
  }
  return *d;
}

// Room for one plain block gathered from a repacked matrix (Q4_0, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K:
// 18, 34, 84, 110, 144, 176 or 210 bytes).
constexpr int64_t kScratchBytes = 256;

// The plain bytes of the block of `row` holding element `block`·block_elems, in either layout.
const uint8_t* BlockAt(const Matrix& w, const WeightTypeDesc&, int64_t row, int64_t block,
                       uint8_t* scratch) {
  return PlainBlock(w, row, block, scratch);
}

}  // namespace

Status CheckMatrix(const Matrix& w) {
  const WeightTypeDesc* d = FindWeightType(w.type);
  if (d == nullptr) {
    return Status::Error(fmt::format("weight type id {} is not supported (supported: {})",
                                     static_cast<int>(w.type), WeightTypeLabelList()));
  }
  if (w.rows < 0 || w.cols < 1) {
    return Status::Error(fmt::format("{} matrix has shape [{}][{}]; expected rows >= 0 and cols >= 1",
                                     d->label, w.rows, w.cols));
  }
  if (w.cols % d->block_elems != 0) {
    return Status::Error(fmt::format(
        "{} matrix has {} columns, which is not a multiple of {}: {} stores each row as blocks of {} "
        "elements", d->label, w.cols, d->block_elems, d->label, d->block_elems));
  }
  return Status::Ok();
}

int64_t MatrixRowBytes(WeightType type, int64_t cols) {
  const WeightTypeDesc* d = FindWeightType(type);
  return d != nullptr ? cols / d->block_elems * d->block_bytes : 0;
}

float DecodeWeight(const Matrix& w, int64_t row, int64_t col) {
  const WeightTypeDesc& d = Desc("DecodeWeight", w.type);
  float block[kMaxWeightBlockElems];  // [block_elems]
  uint8_t scratch[kScratchBytes];
  d.dequantize_block_ref(BlockAt(w, d, row, col / d.block_elems, scratch), block);
  return block[col % d.block_elems];
}

void DecodeWeightRow(const Matrix& w, int64_t row, float* out) {
  const WeightTypeDesc& d = Desc("DecodeWeightRow", w.type);
  uint8_t scratch[kScratchBytes];
  for (int64_t b = 0; b < w.cols / d.block_elems; ++b) {
    d.dequantize_block_ref(BlockAt(w, d, row, b, scratch), out + b * d.block_elems);
  }
}

void MatVecReference(const Matrix& w, const float* x, float* y) {
  std::vector<float> row(w.cols);  // [cols] the decoded row
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
  const WeightTypeDesc& d = Desc("BlockDotReference", w.type);
  if (d.code_ref == nullptr) {
    fmt::print(stderr, "kvq: BlockDotReference: {} is not a one-scale type with blocks of 32\n", d.label);
    std::abort();
  }
  uint8_t scratch[kScratchBytes];
  const uint8_t* p = BlockAt(w, d, row, block, scratch);
  int32_t dot = 0;
  for (int64_t i = 0; i < kBlockElems; ++i) dot += d.code_ref(p, i) * q[block * kBlockElems + i];
  return dot;
}

void MatVecQuantizedReference(const Matrix& w, const float* x, QuantizedProductReference* out) {
  const WeightTypeDesc& desc = Desc("MatVecQuantizedReference", w.type);
  if (!desc.quantized_activation) {
    fmt::print(stderr, "kvq: MatVecQuantizedReference: {} does not quantise the activation\n", desc.label);
    std::abort();
  }
  const int64_t n_blocks = w.cols / kBlockElems;  // activation blocks
  std::vector<int8_t> q(w.cols);   // [cols]
  std::vector<float> d(n_blocks);  // [cols / 32]
  QuantizeActivationReference(x, w.cols, q.data(), d.data());
  std::vector<double> wv(w.cols), abs(w.cols);  // [cols] exact weights, magnitudes of their terms
  constexpr double kXError = 0.5 + 0x1p-17;     // per element, in units of d_x (matvec.h)
  uint8_t scratch[kScratchBytes];
  for (int64_t r = 0; r < w.rows; ++r) {
    for (int64_t b = 0; b < w.cols / desc.block_elems; ++b) {
      desc.exact_block_ref(BlockAt(w, desc, r, b, scratch), wv.data() + b * desc.block_elems,
                           abs.data() + b * desc.block_elems);
    }
    QuantizedProductReference& o = out[r];
    o = {};
    for (int64_t b = 0; b < n_blocks; ++b) {
      double dot = 0, abs_dot = 0, abs_w = 0;
      for (int64_t i = b * kBlockElems; i < (b + 1) * kBlockElems; ++i) {
        dot += wv[i] * q[i];
        abs_dot += abs[i] * std::abs(q[i]);
        abs_w += std::fabs(wv[i]);
      }
      o.y += static_cast<double>(d[b]) * dot;
      o.abs_sum += static_cast<double>(d[b]) * abs_dot;
      o.x_error_bound += static_cast<double>(d[b]) * kXError * abs_w;
    }
  }
}

}  // namespace kvq
