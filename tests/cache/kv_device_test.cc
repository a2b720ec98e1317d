// KvCache::AttendOnDevice (kvq/kv_device.h) against a device written here over kvq's CPU
// attention: it receives only what the interface gives (the slot bytes, the window descriptors,
// the cos/sin of prerope keys) and rebuilds the windows from them, so equality with
// KvCache::Attend — strict, bit for bit — shows the cache streams the right bytes in the right
// layout and order, through every format and transform, every page size and every budget; and
// that a slot is never overwritten before its window was consumed, the device never holds more
// than the budget, and the device's errors stop the call.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "formats/transforms/hadamard.h"
#include "kvq/kv_cache.h"
#include "kvq/kv_device.h"

namespace kvq {
namespace {

constexpr AttentionShape kShape{.n_heads = 8, .n_kv_heads = 2, .head_dim = 16};
constexpr int64_t kElems = 2 * 16;  // one position's row of every KV head

// n numbers from N(0, scale²), with every 37th a 6-sigma outlier (so scales and groups matter).
std::vector<float> Rows(int64_t n, std::mt19937& rng, float scale) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) x[i] = i % 37 == 5 ? 6 * scale : dist(rng);
  return x;
}

RopeConfig TestRope() {
  return {.theta = 500.0f, .pairing = RopePairing::kHalves, .position_scale = 0.5f, .rotary_dims = 12};
}

// A KvDevice over host memory and kvq's CPU attention. Slots are allocated in Begin (their bytes
// counted); Attend rebuilds the KvWindow from the slot alone.
class HostKvDevice final : public KvDevice {
 public:
  explicit HostKvDevice(std::vector<float> q) : q_input_(std::move(q)) {}

  Status Begin(const KvDeviceLayer& d) override {
    d_ = d;
    slots_.assign(static_cast<size_t>(d.slots), std::vector<uint8_t>(static_cast<size_t>(d.slot_bytes)));
    slot_window_done_.assign(static_cast<size_t>(d.slots), true);
    allocated_bytes_ = int64_t{d.slots} * d.slot_bytes;
    q_ = q_input_;
    if (d.rotate_queries) RotateHeads(d.rotation_signs, d.head_dim, int64_t{d.n_tokens} * kShape.n_heads, q_.data());
    state_ = std::make_unique<AttentionState>(kShape, d.n_tokens);
    windows_ = 0;
    return Status::Ok();
  }
  Status Upload(int32_t slot, const uint8_t* bytes, int64_t n) override {
    if (slot < 0 || slot >= d_.slots || n > d_.slot_bytes) return Status::Error("upload out of the slots");
    // A slot is written again only after its previous window was attended (a GPU queue's order).
    if (!slot_window_done_[slot]) return Status::Error("slot overwritten before its window was read");
    std::memcpy(slots_[slot].data(), bytes, static_cast<size_t>(n));
    slot_window_done_[slot] = false;
    return Status::Ok();
  }
  Status Attend(const KvDeviceWindow& w) override {
    if (fail_at_window_ == windows_) return Status::Error("device lost");
    ++windows_;
    if (w.bytes > d_.slot_bytes) return Status::Error("window larger than its slot");
    const uint8_t* slot = slots_[w.slot].data();
    auto f32 = [&](int64_t offset) { return reinterpret_cast<const float*>(slot + offset); };
    KvWindow window;
    window.first_position = w.first_position;
    const KvDeviceWindow::Tensor* t[2] = {&w.k, &w.v};
    RowsView* views[2] = {&window.k, &window.v};
    for (int which = 0; which < 2; ++which) {
      RowsView& v = *views[which];
      v.codec = which == 0 ? &d_.key_format->key : &d_.value_format->value;
      v.args = which == 0 ? d_.key_args : d_.value_args;
      v.head = f32(t[which]->head_offset);
      v.n_head_rows = t[which]->n_head;
      v.blocks = slot + t[which]->blocks_offset;
      v.n_block_rows = t[which]->n_block;
      v.residual = f32(t[which]->residual_offset);
      v.n_rows = w.n_rows;
    }
    if (d_.pre_rope) {  // keys decoded and roped here from the window's cos/sin, then read as f32 rows
      roped_.resize(static_cast<size_t>(w.n_rows * kElems));
      for (int64_t r = 0; r < w.n_rows; ++r) {
        float* row = roped_.data() + r * kElems;
        const RowsView& k = window.k;
        if (r < k.n_head_rows) {
          std::memcpy(row, k.head + r * kElems, kElems * 4);
        } else if (r < k.n_block_rows) {
          const int32_t g = k.codec->rows_per_block;
          k.codec->decode_row(k.blocks + (r / g) * k.codec->block_bytes(k.args.shape), static_cast<int32_t>(r % g), row,
                              k.args);
        } else {
          std::memcpy(row, k.residual + (r - k.n_block_rows) * kElems, kElems * 4);
        }
        RotateByCosSin(row, static_cast<int32_t>(kElems), d_.head_dim, w.key_rope.data() + r * d_.rotary_dims,
                       d_.rope_pairing, d_.rotary_dims);
      }
      window.k.head = roped_.data();
      window.k.n_head_rows = window.k.n_block_rows = w.n_rows;
    }
    AttendWindow({.scale = d_.scale, .softcap = d_.softcap, .threads = 1}, q_.data(), d_.first_query_position, window,
                 *state_);
    slot_window_done_[w.slot] = true;
    return Status::Ok();
  }
  Status Finish() override {
    out_.resize(static_cast<size_t>(d_.n_tokens) * kShape.n_heads * kShape.head_dim);
    FinishAttention(*state_, out_.data());
    if (d_.unrotate_output) {
      UnrotateHeads(d_.rotation_signs, d_.head_dim, int64_t{d_.n_tokens} * kShape.n_heads, out_.data());
    }
    return Status::Ok();
  }

  const std::vector<float>& out() const { return out_; }
  int64_t windows() const { return windows_; }
  int64_t allocated_bytes() const { return allocated_bytes_; }
  int64_t fail_at_window_ = -1;

 private:
  std::vector<float> q_input_, q_, out_, roped_;
  KvDeviceLayer d_;
  std::vector<std::vector<uint8_t>> slots_;
  std::vector<bool> slot_window_done_;
  std::unique_ptr<AttentionState> state_;
  int64_t windows_ = 0, allocated_bytes_ = 0;
};

struct Case {
  std::string spec;
  int32_t page = 32;
  int64_t device_bytes = 0;
  int32_t n_tokens = 1;
};

// Appends `n` random rows (outliers included) to a cache of `c` — the last n_tokens as their own
// Append, as a forward block appends its rows — then compares AttendOnDevice with Attend for those
// positions as queries: the device takes them in runs of QueriesInOneState tokens. Returns the
// number of device calls per layer.
int32_t ExpectDeviceEqualsAttend(const Case& c, int64_t n, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << c.spec << " page " << c.page << " device " << c.device_bytes << " tokens "
                                  << c.n_tokens << " n " << n);
  Result<KvSpec> spec = ParseKvSpec(c.spec);
  EXPECT_TRUE(spec.ok()) << spec.status().message();
  if (!spec.ok()) return 0;
  KvCacheConfig config{.n_layers = 2, .n_kv_heads = kShape.n_kv_heads, .head_dim = kShape.head_dim,
                       .layers = {LayerFormats::Both(*spec)}, .key_rope = TestRope(), .max_positions = 200,
                       .page_positions = c.page, .budgets = {.device_bytes = c.device_bytes}};
  Result<std::unique_ptr<KvCache>> cache = KvCache::Create(config);
  EXPECT_TRUE(cache.ok()) << cache.status().message();
  if (!cache.ok()) return 0;
  std::mt19937 rng(seed);
  for (int64_t layer = 0; layer < 2; ++layer) {
    const std::vector<float> k = Rows(n * kElems, rng, 2.0f);
    const std::vector<float> v = Rows(n * kElems, rng, 2.0f);
    const int64_t head = n - c.n_tokens;
    EXPECT_TRUE((*cache)->Append(layer, k.data(), v.data(), head).ok());
    EXPECT_TRUE((*cache)->Append(layer, k.data() + head * kElems, v.data() + head * kElems, c.n_tokens).ok());
  }
  const int64_t q_row = int64_t{kShape.n_heads} * kShape.head_dim;
  const std::vector<float> q = Rows(c.n_tokens * q_row, rng, 1.0f);
  const AttentionOptions options{.scale = 0.25f, .threads = 1};
  int32_t calls = 0;
  for (int64_t layer = 0; layer < 2; ++layer) {
    AttentionState state(kShape, c.n_tokens);
    EXPECT_TRUE((*cache)->Attend(layer, options, q.data(), n - c.n_tokens, state).ok());
    std::vector<float> expected(q.size());
    (*cache)->FinishAttention(layer, state, expected.data());
    calls = 0;
    for (int32_t t0 = 0; t0 < c.n_tokens; ++calls) {
      const int64_t first = n - c.n_tokens + t0;
      const int32_t run = (*cache)->QueriesInOneState(layer, first, c.n_tokens - t0);
      EXPECT_GE(run, 1);
      if (run < 1) return 0;
      HostKvDevice device(std::vector<float>(q.begin() + t0 * q_row, q.begin() + (t0 + run) * q_row));
      if (run < c.n_tokens - t0) {  // the whole rest in one call is refused, naming the split
        HostKvDevice all(std::vector<float>(q.begin() + t0 * q_row, q.end()));
        const Status refused = (*cache)->AttendOnDevice(layer, options, first, c.n_tokens - t0, all);
        EXPECT_NE(refused.message().find("separate calls"), std::string::npos) << refused.message();
      }
      const Status s = (*cache)->AttendOnDevice(layer, options, first, run, device);
      EXPECT_TRUE(s.ok()) << s.message();
      if (!s.ok()) return 0;
      const KvTierPlan& plan = (*cache)->plan();
      EXPECT_EQ(device.allocated_bytes(), int64_t{plan.device_slots > 0 ? plan.device_slots : 2} * plan.slot_bytes);
      if (c.device_bytes > 0) {
        EXPECT_LE(device.allocated_bytes(), c.device_bytes);
      }
      // The run's last query reads the pages holding its own position.
      EXPECT_EQ(device.windows(), (first + run - 1) / c.page + 1);
      EXPECT_EQ(device.out().size(), static_cast<size_t>(run * q_row));
      for (int64_t i = 0; i < run * q_row && i < static_cast<int64_t>(device.out().size()); ++i) {
        EXPECT_EQ(device.out()[i], expected[t0 * q_row + i]) << "output " << t0 * q_row + i;  // strict: the same bits
        if (device.out()[i] != expected[t0 * q_row + i]) return 0;
      }
      t0 += run;
    }
  }
  return calls;
}

TEST(KvDevice, EveryFormatStreamedToADeviceEqualsAttendBitwise) {
  for (const FormatDesc* f : Formats()) {
    for (int32_t page : {32, 64}) {
      ExpectDeviceEqualsAttend({.spec = f->name, .page = page}, 150, 11);
    }
  }
}

TEST(KvDevice, TransformsStreamedToADeviceEqualAttendBitwise) {
  int32_t split_blocks = 0;
  for (const std::string spec : {"int4+rot", "int8+sink4", "int4+res40", "int4-kivi+sink4+res16", "int2-kivi+rot",
                                 "fp8-e4m3+sink3", "int4+prerope", "int4-kivi+prerope+sink2+res8", "f32+prerope",
                                 "fp4-e2m1+rot+sink5+res33"}) {
    for (int32_t page : {32, 96}) {
      for (int32_t n_tokens : {1, 5}) {
        // 161 positions: several pages, sinks in the first, the residual in the last; 30: one
        // page holding head, block and residual rows at once.
        for (int64_t n : {161, 30}) {
          const int32_t calls = ExpectDeviceEqualsAttend({.spec = spec, .page = page, .n_tokens = n_tokens}, n, 12);
          split_blocks += calls > 1 ? 1 : 0;
        }
      }
    }
  }
  EXPECT_GT(split_blocks, 0);  // some blocks read the cache in more than one state
}

TEST(KvDevice, StreamsWithinTheDeviceBudget) {
  // Two, three and five slots of a 32-position page; the context is 6 pages, so slots are reused.
  KvCacheConfig probe{.n_layers = 2, .n_kv_heads = kShape.n_kv_heads, .head_dim = kShape.head_dim,
                      .layers = {LayerFormats::Both(*ParseKvSpec("int4+res20"))}, .max_positions = 200,
                      .page_positions = 32};
  const int64_t slot = KvCache::Plan(probe)->slot_bytes;
  for (int64_t slots : {2, 3, 5}) {
    ExpectDeviceEqualsAttend({.spec = "int4+res20", .page = 32, .device_bytes = slots * slot + slot / 2, .n_tokens = 3},
                             190, 13);
  }
}

TEST(KvDevice, DeviceErrorsStopTheCallAndBadArgumentsAreRefused) {
  KvCacheConfig config{.n_layers = 1, .n_kv_heads = kShape.n_kv_heads, .head_dim = kShape.head_dim,
                       .layers = {LayerFormats::Both(*ParseKvSpec("int8"))}, .max_positions = 128,
                       .page_positions = 32};
  std::unique_ptr<KvCache> cache = std::move(KvCache::Create(config)).value();
  std::mt19937 rng(5);
  const std::vector<float> k = Rows(100 * kElems, rng, 1.0f);
  ASSERT_TRUE(cache->Append(0, k.data(), k.data(), 100).ok());
  HostKvDevice device(Rows(kShape.n_heads * kShape.head_dim, rng, 1.0f));
  device.fail_at_window_ = 2;
  const Status lost = cache->AttendOnDevice(0, {.scale = 0.25f}, 99, 1, device);
  EXPECT_EQ(lost.message(), "device lost");
  EXPECT_EQ(device.windows(), 2);  // the third window failed; no later one was attempted
  device.fail_at_window_ = -1;
  EXPECT_TRUE(cache->AttendOnDevice(0, {.scale = 0.25f}, 99, 1, device).ok());
  EXPECT_FALSE(cache->AttendOnDevice(1, {.scale = 0.25f}, 99, 1, device).ok());
  EXPECT_FALSE(cache->AttendOnDevice(0, {.scale = 0.25f}, 99, 0, device).ok());
}

}  // namespace
}  // namespace kvq
