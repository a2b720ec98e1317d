// RunContextBench and FillContext (see context_bench.h). The disk tier's cold reads: before each
// step on a disk arm the cache file's dirty pages are written back and dropped from the OS page
// cache (fdatasync + POSIX_FADV_DONTNEED on a second descriptor of the same file), so the step
// reads from the device, not from RAM the kernel kept.
#include "measure/context_bench.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <random>

#include "cache/page_copies.h"
#include "kvq/kv_memory.h"
#include "kvq/units.h"
#include "measure/read_bandwidth.h"
#include "model/cache_config.h"

namespace kvq {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 == 1 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

Status IoError(const std::string& what, const std::string& path) {
  return Status::Error(fmt::format("bench context: {} {}: {}", what, path, std::strerror(errno)));
}

// A read-only descriptor of a disk arm's cache file, for dropping it from the page cache.
class ColdFile {
 public:
  static Result<std::unique_ptr<ColdFile>> Open(const std::string& path) {
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return IoError("cannot open", path);
    return std::unique_ptr<ColdFile>(new ColdFile(fd, path));
  }
  ~ColdFile() { close(fd_); }
  // Written back first: DONTNEED leaves dirty pages in the cache.
  Status Drop() const {
    if (fdatasync(fd_) != 0) return IoError("cannot write back", path_);
    if (posix_fadvise(fd_, 0, 0, POSIX_FADV_DONTNEED) != 0)
      return IoError("cannot drop from the page cache", path_);
    return Status::Ok();
  }
  // Reads up to max_bytes from the start, cold, 4 MiB at a time; sets *bytes, returns GB/s.
  Result<double> ReadRate(int64_t max_bytes, int64_t* bytes) const {
    if (Status s = Drop(); !s.ok()) return s;
    std::vector<uint8_t> buffer(4 << 20);  // [4 MiB]
    int64_t done = 0;
    const auto t0 = Clock::now();
    while (done < max_bytes) {
      const ssize_t n =
          pread(fd_, buffer.data(), std::min<int64_t>(buffer.size(), max_bytes - done), done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return IoError("cannot read", path_);
      if (n == 0) break;
      done += n;
    }
    const double seconds = SecondsSince(t0);
    *bytes = done;
    return done / seconds / 1e9;
  }

 private:
  ColdFile(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  int fd_;
  std::string path_;
};


// The arm's cache: resident host, host streamed, or disk streamed. A streamed tier's working set
// is the configured budget, or 8 pages — 2 when 8 would hold the whole cache (it would not stream).
Result<std::unique_ptr<KvCache>> MakeArmCache(const DecoderConfig& c, const FormatDesc* f,
                                              CacheTier tier, int64_t positions,
                                              const ContextBenchConfig& config) {
  Result<KvCacheConfig> model_cc =
      ModelCacheConfig(c, positions, {.layers = {{f, f}}, .budgets = {.host_bytes = config.host_bytes}});
  if (!model_cc.ok()) return model_cc.status();
  KvCacheConfig cc = *model_cc;
  if (tier != CacheTier::kHost) {
    Result<KvTierPlan> resident = KvCache::Plan(cc);
    if (!resident.ok()) return resident.status();
    int64_t device = config.device_bytes;
    if (device == 0) {
      device = 8 * resident->slot_bytes;
      if (device >= resident->total_bytes + resident->slot_bytes) device = 2 * resident->slot_bytes;
    }
    cc.budgets.device_bytes = device;
  }
  if (tier == CacheTier::kDisk) {
    if (config.disk_dir.empty())
      return Status::Error("the disk tier needs a folder (--kv-disk DIR)");
    cc.budgets.disk_dir = config.disk_dir;
  }
  Result<std::unique_ptr<KvCache>> cache = KvCache::Create(cc);
  if (!cache.ok()) return cache.status();
  if (tier == CacheTier::kStreamed && (*cache)->plan().device_slots == 0) {
    return Status::Error(fmt::format(
        "--kv-device-budget {} holds the whole {} cache: the streamed tier would "
        "not stream; give a smaller budget",
        FormatBytesIec(cc.budgets.device_bytes), FormatBytesIec((*cache)->plan().total_bytes)));
  }
  return cache;
}

// Multiply-adds per second of the model's attention on `format`, with a 2,048-position window in
// cache: the kernel's compute rate when bytes are not what it waits for.
Result<double> KernelGmacs(const DecoderModel& model, const FormatDesc* format, uint64_t seed) {
  const DecoderConfig& c = model.config();
  constexpr int64_t kPositions = 2048;
  Result<KvCacheConfig> model_cc = ModelCacheConfig(c, kPositions, {.layers = {{format, format}}});
  if (!model_cc.ok()) return model_cc.status();
  KvCacheConfig cc = *model_cc;
  cc.n_layers = 1;  // one layer's attention is the rate
  Result<std::unique_ptr<KvCache>> cache = KvCache::Create(cc);
  if (!cache.ok()) return cache.status();
  if (Status s = FillContext(**cache, kPositions, seed, {}, ""); !s.ok()) return s;
  const AttentionShape shape{
      .n_heads = c.n_heads, .n_kv_heads = c.n_kv_heads, .head_dim = c.head_dim()};
  std::vector<float> q(static_cast<size_t>(c.n_heads) * c.head_dim(), 0.5f);  // [n_heads][head_dim]
  AttentionState state(shape, 1);
  const AttentionOptions options = model.attention_options();
  const double macs = 2.0 * kPositions * c.n_heads * c.head_dim();
  std::vector<double> rates;
  for (int32_t rep = 0; rep < 6; ++rep) {  // the first warms up and is dropped
    const auto t0 = Clock::now();
    int32_t calls = 0;
    do {
      state.Reset();
      if (Status s = (*cache)->Attend(0, options, q.data(), kPositions, state); !s.ok()) return s;
      ++calls;
    } while (SecondsSince(t0) < 0.05);
    if (rep > 0) rates.push_back(calls * macs / SecondsSince(t0) / 1e9);
  }
  return Median(rates);
}

}  // namespace

const char* CacheTierName(CacheTier tier) {
  switch (tier) {
    case CacheTier::kHost:
      return "host";
    case CacheTier::kStreamed:
      return "streamed";
    case CacheTier::kDisk:
      return "disk";
  }
  return "?";
}

Result<CacheTier> ParseCacheTier(std::string_view name) {
  for (CacheTier t : {CacheTier::kHost, CacheTier::kStreamed, CacheTier::kDisk}) {
    if (name == CacheTierName(t)) return t;
  }
  return Status::Error(fmt::format("unknown tier '{}' (known: host, streamed, disk)", name));
}

Status FillContext(KvCache& cache, int64_t n, uint64_t seed, const ProgressFn& progress,
                   const std::string& name) {
  const KvCacheConfig& c = cache.config();
  const int64_t P = c.page_positions, row = int64_t{c.n_kv_heads} * c.head_dim;
  const int64_t pool = std::min<int64_t>(n, 4 * P);  // positions encoded by Append
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> k(pool * row), v(pool * row);  // [pool][n_kv_heads][head_dim]
  for (float& x : k) x = dist(rng);
  for (float& x : v) x = dist(rng);
  const int64_t pool_pages = pool / P, pages = n / P, tail = n - pages * P;
  const auto t0 = Clock::now();
  double last_report = 0;
  const double total_pages = static_cast<double>(std::max<int64_t>(1, pages)) * c.n_layers;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    if (cache.positions(l) != 0)
      return Status::Error(fmt::format("FillContext: layer {} is not empty", l));
    // The pool's whole pages (the tail too, when there are no whole pages to copy from).
    const int64_t first = pool_pages > 0 ? pool_pages * P : n;
    if (Status s = cache.Append(l, k.data(), v.data(), first); !s.ok()) return s;
    for (int64_t done = pool_pages; pool_pages > 0 && done < pages;) {
      const int64_t chunk = std::min<int64_t>(1024, pages - done);
      if (Status s = AppendPageCopies(cache, l, 0, pool_pages, chunk); !s.ok()) return s;
      done += chunk;
      const double seconds = SecondsSince(t0);
      if (progress && seconds - last_report >= 5) {
        last_report = seconds;
        const double share = (static_cast<double>(l) * pages + done) / total_pages;
        progress(fmt::format("{}: filling layer {} of {}, {:.0f}% after {:.0f} s, ETA {:.0f} s",
                             name, l + 1, c.n_layers, 100 * share, seconds,
                             seconds * (1 - share) / share));
      }
    }
    if (pool_pages > 0 && tail > 0) {
      if (Status s = cache.Append(l, k.data(), v.data(), tail); !s.ok()) return s;
    }
  }
  if (progress && !name.empty())
    progress(fmt::format("{}: filled {} positions in {:.1f} s", name, n, SecondsSince(t0)));
  return Status::Ok();
}

Result<ContextBenchReport> RunContextBench(DecoderModel& model, const ContextBenchConfig& config,
                                           const ProgressFn& progress) {
  const DecoderConfig& c = model.config();
  if (config.formats.empty() || config.tiers.empty() || config.contexts.empty() ||
      config.reps <= 0) {
    return Status::Error("bench context: give at least one format, tier and context, and reps > 0");
  }
  ContextBenchReport report;
  auto say = [&](const std::string& line) {
    if (progress) progress(line);
  };
  report.read_gbps =
      MeasureReadBandwidthGbps(config.read_bandwidth_bytes, model.attention_options().threads, 5);
  say(fmt::format("read bandwidth {:.1f} GB/s", report.read_gbps));
  std::vector<float> logits(c.vocab_size);  // [vocab]
  {  // The step at context 0: the weights and everything but attention over the cache.
    Result<std::unique_ptr<KvCache>> empty =
        CreateModelCache(c, config.reps + 1, {.layers = {{config.formats[0], config.formats[0]}}});
    if (!empty.ok()) return empty.status();
    std::vector<double> ms;
    for (int32_t step = 0; step <= config.reps; ++step) {
      const auto t0 = Clock::now();
      if (Status s = model.Forward(1 % c.vocab_size, step, **empty, logits.data()); !s.ok())
        return s;
      if (step > 0) ms.push_back(1000 * SecondsSince(t0));
    }
    report.weights_ms = Median(ms);
  }
  std::vector<double> gmacs;  // per format
  for (const FormatDesc* f : config.formats) {
    Result<double> rate = KernelGmacs(model, f, config.seed);
    if (!rate.ok()) return rate.status();
    gmacs.push_back(*rate);
    say(fmt::format("attention kernel, {} with its window in cache: {:.2f} GMAC/s", f->name,
                    *rate));
  }

  for (int64_t n : config.contexts) {
    const int64_t positions = n + 1 + config.reps;  // the fill, the untimed step, the timed steps
    if (n < 0 || (positions > c.seq_len && !config.past_model_context)) {
      return Status::Error(
          fmt::format("context {} plus {} decode steps is past the model's context of {} positions",
                      n, 1 + config.reps, c.seq_len));
    }
    struct Arm {
      const FormatDesc* format;
      size_t format_index;
      CacheTier tier;
      std::unique_ptr<KvCache> cache;
      std::unique_ptr<ColdFile> cold;  // disk arms
      double fill_seconds = 0;
      std::vector<double> ms, wait_ms, copy_ms;
      std::vector<std::vector<float>> logits;  // [step][vocab]
    };
    std::vector<Arm> arms;
    for (size_t fi = 0; fi < config.formats.size(); ++fi) {
      for (CacheTier tier : config.tiers) {
        Arm arm{.format = config.formats[fi], .format_index = fi, .tier = tier};
        Result<std::unique_ptr<KvCache>> cache =
            MakeArmCache(c, arm.format, tier, positions, config);
        if (!cache.ok()) return cache.status();
        arm.cache = std::move(cache).value();
        const std::string name =
            fmt::format("{}/{} at {}", arm.format->name, CacheTierName(tier), n);
        const auto t0 = Clock::now();
        if (Status s = FillContext(*arm.cache, n, config.seed, progress, name); !s.ok()) return s;
        arm.fill_seconds = SecondsSince(t0);
        if (tier == CacheTier::kDisk) {
          Result<std::unique_ptr<ColdFile>> cold = ColdFile::Open(arm.cache->plan().disk_file);
          if (!cold.ok()) return cold.status();
          arm.cold = std::move(cold).value();
        }
        arms.push_back(std::move(arm));
      }
    }
    for (int32_t step = 0; step <= config.reps; ++step) {
      for (Arm& arm : arms) {
        if (arm.cold && config.cold_disk) {
          if (Status s = arm.cold->Drop(); !s.ok()) return s;
        }
        const double wait0 = arm.cache->stream_wait_seconds(),
                     copy0 = arm.cache->stream_copy_seconds();
        const auto t0 = Clock::now();
        // Any token will do: the step's cost does not depend on which one.
        if (Status s = model.Forward(1 % c.vocab_size, n + step, *arm.cache, logits.data());
            !s.ok())
          return s;
        const double ms = 1000 * SecondsSince(t0);
        if (step > 0) {  // step 0 warms the caches and the thread pool
          arm.ms.push_back(ms);
          arm.wait_ms.push_back(1000 * (arm.cache->stream_wait_seconds() - wait0));
          arm.copy_ms.push_back(1000 * (arm.cache->stream_copy_seconds() - copy0));
        }
        arm.logits.push_back(logits);
        say(fmt::format("{}/{} at {}: step {} of {}: {:.0f} ms", arm.format->name,
                        CacheTierName(arm.tier), n, step, config.reps, ms));
      }
    }
    // The disk's read rate, after the steps (right after the fill the device is still busy writing
    // back; these figures come from one quiet read of the first disk arm's file, cold).
    for (const Arm& arm : arms) {
      if (!arm.cold || report.disk_read_gbps != 0) continue;
      Result<double> rate = arm.cold->ReadRate(int64_t{2} << 30, &report.disk_read_bytes);
      if (!rate.ok()) return rate.status();
      report.disk_read_gbps = *rate;
      say(fmt::format("disk read {:.2f} GB/s ({} of {} cold)", *rate,
                      FormatBytesIec(report.disk_read_bytes), arm.cache->plan().disk_file));
    }
    for (const Arm& arm : arms) {
      ContextBenchRow r;
      r.format = arm.format->name;
      r.tier = arm.tier;
      r.context = n;
      r.ms_median = Median(arm.ms);
      r.ms_min = *std::min_element(arm.ms.begin(), arm.ms.end());
      r.ms_max = *std::max_element(arm.ms.begin(), arm.ms.end());
      r.fill_seconds = arm.fill_seconds;
      r.plan = arm.cache->plan();
      r.device_peak_bytes = arm.cache->device_peak_bytes();
      Result<int64_t> kv = KvBytesForContext(
          *arm.format,
          ModelKvShape(c), n);
      if (!kv.ok()) return kv.status();
      r.kv_bytes = *kv;
      r.attention_macs = 2.0 * static_cast<double>(n) * c.n_attention_layers() * c.n_heads * c.head_dim();
      r.compute_gmacs = gmacs[arm.format_index];
      r.memory_ms = r.kv_bytes / (report.read_gbps * 1e6);
      r.disk_ms = arm.tier == CacheTier::kDisk ? r.kv_bytes / (report.disk_read_gbps * 1e6) : 0;
      r.compute_ms = r.attention_macs / (r.compute_gmacs * 1e6);
      r.wait_ms = Median(arm.wait_ms);
      r.copy_ms = Median(arm.copy_ms);
      // The resource that needs the most time: the bounds for memory and compute, and for a
      // streamed tier the copy thread's measured reading time (from disk, or host RAM).
      r.limiter = r.memory_ms > r.compute_ms ? "memory" : "compute";
      if (r.copy_ms > std::max(r.memory_ms, r.compute_ms))
        r.limiter = arm.tier == CacheTier::kDisk ? "disk" : "stream";
      const Arm* first = nullptr;
      for (const Arm& a : arms) first = first == nullptr && a.format == arm.format ? &a : first;
      r.compared_with = CacheTierName(first->tier);
      for (size_t s = 0; s < arm.logits.size(); ++s) {
        r.logits_identical =
            r.logits_identical &&
            std::memcmp(arm.logits[s].data(), first->logits[s].data(), logits.size() * 4) == 0;
      }
      report.rows.push_back(r);
    }
  }
  return report;
}

}  // namespace kvq
