// RepackMatrix and PlainBlock (see repack.h): the byte moves between the file's row-major Q4_0 /
// Q8_0 / Q1_0 / Q2_0 blocks and the 16-row interleaved groups, in plain C++ (a load-time pass, and
// the oracle's view of a repacked matrix).
#include "weights/repack.h"

#include <cstring>

#include "weights/kquant_repack.h"
#include "weights/matvec.h"
#include "weights/q1_0/q1_0.h"
#include "weights/q2_0/q2_0.h"
#include "weights/q4_0/q4_0.h"
#include "weights/q8_0/q8_0.h"
#include "weights/weight_type.h"

namespace kvq {
namespace {

constexpr int64_t kScaleBytes = 2;  // f16 d at the start of a Q4_0 / Q8_0 / Q1_0 block

// Bytes of a group's block b that hold d of its rows; bytes of one code vector (4 per row).
constexpr int64_t kGroupScaleBytes = kInterleaveRows * kScaleBytes;
constexpr int64_t kVectorBytes = kInterleaveRows * 4;

int64_t BlockBytes(WeightType type) { return type == WeightType::kQ8_0 ? 34 : 18; }  // Q4_0, Q1_0, Q2_0: 18

// Where block b of n_blocks sits in a group, in group blocks: in order, except Q1_0's (q1_0.h).
int64_t BlockAt(WeightType type, int64_t b, int64_t n_blocks) {
  return type == WeightType::kQ1_0 ? weights_q1_0::RepackedBlockAt(b, n_blocks) : b;
}

// A Q2_0 block's 16 code bytes between the file's order (element n in bits 2(n % 4) of byte n / 4)
// and the interleaved one (element 16p + 4k + e in bits 2p of byte 4k + e, repack.h), which the
// byte moves below then spread over the group's vectors as they do Q4_0's bytes.
void Q2_0CodesToInterleaved(const uint8_t* plain, uint8_t* out) {  // [16] -> [16]
  for (int64_t i = 0; i < 16; ++i) {
    uint8_t byte = 0;
    for (int64_t p = 0; p < 4; ++p) {
      const int64_t n = 16 * p + i;  // i = 4k + e
      byte = static_cast<uint8_t>(byte | ((plain[n / 4] >> (2 * (n % 4)) & 3) << (2 * p)));
    }
    out[i] = byte;
  }
}
void Q2_0CodesToPlain(const uint8_t* interleaved, uint8_t* out) {  // [16] -> [16]
  for (int64_t b = 0; b < 16; ++b) {
    uint8_t byte = 0;
    for (int64_t m = 0; m < 4; ++m) {
      const int64_t n = 4 * b + m;
      byte = static_cast<uint8_t>(byte | ((interleaved[n % 16] >> (2 * (n / 16)) & 3) << (2 * m)));
    }
    out[b] = byte;
  }
}

}  // namespace

bool CanRepack(const Matrix& w) {
  const bool legacy = (w.type == WeightType::kQ4_0 && weights_q4_0::RepackPays()) ||  // q4_0.h
                      (w.type == WeightType::kQ8_0 && weights_q8_0::RepackPays());   // q8_0.h
  const bool q1_0 = w.type == WeightType::kQ1_0 && weights_q1_0::RepackPays();  // q1_0.h
  const bool q2_0 = w.type == WeightType::kQ2_0 && weights_q2_0::RepackPays();  // q2_0.h
  // The K-quants only where their x86 interleaved kernels run (kquant_repack.h).
  const bool kquant = IsInterleavedKQuant(w.type) && KQuantRepackPays();
  return w.layout == MatrixLayout::kRowMajor && (legacy || q1_0 || q2_0 || kquant) &&
         w.rows >= kInterleaveRows && w.cols % (legacy ? 32 : q1_0 ? 128 : q2_0 ? 64 : 256) == 0;
}

int64_t MatrixDataBytes(const Matrix& w) { return w.rows * MatrixRowBytes(w.type, w.cols); }

// The K-quants' groups (weights/kquant_repack.h), super-block by super-block.
namespace {
void RepackKQuantGroups(const Matrix& w, uint8_t* out) {
  const int64_t bb = FindWeightType(w.type)->block_bytes;
  const int64_t n_super = w.cols / 256;
  const int64_t row_bytes = n_super * bb;
  for (int64_t g = 0; g < w.rows / kInterleaveRows; ++g) {
    const uint8_t* rows = w.data + g * kInterleaveRows * row_bytes;  // [16][row_bytes] plain
    uint8_t* group = out + g * kInterleaveRows * row_bytes;          // [n_super][16·bb] interleaved
    for (int64_t sb = 0; sb < n_super; ++sb) {
      InterleaveKQuantBlock(w.type, rows, row_bytes, sb, group + sb * kInterleaveRows * bb);
    }
  }
}
}  // namespace

Matrix RepackMatrix(const Matrix& w, uint8_t* out) {
  if (IsInterleavedKQuant(w.type)) {
    RepackKQuantGroups(w, out);
    const int64_t row_bytes = MatrixRowBytes(w.type, w.cols);
    const int64_t tail_at = w.rows / kInterleaveRows * kInterleaveRows * row_bytes;
    std::memcpy(out + tail_at, w.data + tail_at, w.rows * row_bytes - tail_at);
    Matrix r = w;
    r.data = out;
    r.layout = MatrixLayout::kInterleaved16;
    return r;
  }
  const int64_t bb = BlockBytes(w.type);
  const int64_t code_bytes = bb - kScaleBytes;  // 16 (Q4_0, Q1_0) or 32 (Q8_0) per row and block
  const int64_t n_blocks = w.cols / FindWeightType(w.type)->block_elems;
  const int64_t row_bytes = n_blocks * bb;
  const int64_t groups = w.rows / kInterleaveRows;
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* rows = w.data + g * kInterleaveRows * row_bytes;  // [16][row_bytes] plain
    uint8_t* group = out + g * kInterleaveRows * row_bytes;          // [n_blocks][16·bb] interleaved
    for (int64_t b = 0; b < n_blocks; ++b) {
      uint8_t* dst = group + BlockAt(w.type, b, n_blocks) * kInterleaveRows * bb;
      for (int64_t j = 0; j < kInterleaveRows; ++j) {
        const uint8_t* src = rows + j * row_bytes + b * bb;
        uint8_t q2_0_block[18];  // a Q2_0 block with its codes in the interleaved order
        if (w.type == WeightType::kQ2_0) {
          std::memcpy(q2_0_block, src, kScaleBytes);
          Q2_0CodesToInterleaved(src + kScaleBytes, q2_0_block + kScaleBytes);
          src = q2_0_block;
        }
        std::memcpy(dst + j * kScaleBytes, src, kScaleBytes);
        // 4 code bytes of row j per vector k.
        for (int64_t k = 0; k < code_bytes / 4; ++k) {
          std::memcpy(dst + kGroupScaleBytes + k * kVectorBytes + j * 4, src + kScaleBytes + k * 4, 4);
        }
      }
    }
  }
  const int64_t tail_at = groups * kInterleaveRows * row_bytes;  // the rows % 16 plain rows
  std::memcpy(out + tail_at, w.data + tail_at, (w.rows - groups * kInterleaveRows) * row_bytes);
  Matrix r = w;
  r.data = out;
  r.layout = MatrixLayout::kInterleaved16;
  return r;
}

const uint8_t* PlainBlock(const Matrix& w, int64_t row, int64_t block, uint8_t* scratch) {
  const int64_t row_bytes = MatrixRowBytes(w.type, w.cols);
  const int64_t interleaved_rows = w.rows / kInterleaveRows * kInterleaveRows;
  if (w.layout == MatrixLayout::kRowMajor || row >= interleaved_rows) {
    const WeightTypeDesc* d = FindWeightType(w.type);
    return w.data + row * row_bytes + block * d->block_bytes;
  }
  if (IsInterleavedKQuant(w.type)) {
    const int64_t bb = FindWeightType(w.type)->block_bytes;
    const int64_t j = row % kInterleaveRows;
    GatherKQuantBlock(w.type, w.data + (row - j) * row_bytes + block * kInterleaveRows * bb, j, scratch);
    return scratch;
  }
  const int64_t bb = BlockBytes(w.type);
  const int64_t j = row % kInterleaveRows;
  const int64_t n_blocks = w.cols / FindWeightType(w.type)->block_elems;
  const uint8_t* src =
      w.data + (row - j) * row_bytes + BlockAt(w.type, block, n_blocks) * kInterleaveRows * bb;
  std::memcpy(scratch, src + j * kScaleBytes, kScaleBytes);
  for (int64_t k = 0; k < (bb - kScaleBytes) / 4; ++k) {
    std::memcpy(scratch + kScaleBytes + k * 4, src + kGroupScaleBytes + k * kVectorBytes + j * 4, 4);
  }
  if (w.type == WeightType::kQ2_0) {
    uint8_t interleaved[16];  // the block's codes in the interleaved order
    std::memcpy(interleaved, scratch + kScaleBytes, 16);
    Q2_0CodesToPlain(interleaved, scratch + kScaleBytes);
  }
  return scratch;
}

}  // namespace kvq
