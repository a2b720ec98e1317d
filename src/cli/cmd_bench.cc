// `kvq bench attention`: attention speed per KV spec (decode, or a prefill block of query
// tokens), each row beside its roofline — the read bandwidth and compute peaks measured in the same
// run — and a transformed spec's time beside its plain format's, measured in the same run.
#include <fmt/core.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/commands.h"
#include "cli/json_output.h"
#include "cli/flags.h"
#include "formats/int_score.h"
#include "kvq/attention.h"
#include "kvq/format.h"
#include "kvq/units.h"
#include "measure/attention_bench.h"
#include "measure/read_bandwidth.h"
#include "measure/roofline.h"
#include "measure/stream_bench.h"

namespace kvq::cli {
namespace {

// The largest contexts the arms may be asked for (bench stream keeps every arm on the host).
constexpr int64_t kMaxAttentionContext = int64_t{1} << 24;
constexpr int64_t kMaxStreamContext = int64_t{1} << 22;

struct BenchAttentionOptions {
  SharedOptions shared{.formats = {"f32", "f16", "int8", "int4"}, .contexts = {4096, 16384}};
  int64_t head_dim = 128;
  int64_t q_heads = 32;
  std::vector<int64_t> kv_heads = {8};  // each its own table, against the same ceilings
  int64_t reps = 9;
  int64_t queries = 1;
  std::vector<int64_t> query_blocks = {0};
};

// One row's floor: the KV bytes at the read bandwidth, and the multiply-adds at the peaks (the
// score half at the int8 dot peak when the key codec scores in int8), whichever is slower.
struct Floor {
  double bytes_ns, macs_ns;
  double ns() const { return std::max(bytes_ns, macs_ns); }
};

Floor RowFloor(const AttentionBenchRow& r, double read_gbps, const ComputeRoofline& peak) {
  const double score_gmacs = r.int8_scores ? peak.best_int8_gmacs : peak.best_f32_gmacs;
  return {static_cast<double>(r.kv_bytes) / read_gbps,
          static_cast<double>(r.score_macs) / score_gmacs + static_cast<double>(r.value_macs) / peak.best_f32_gmacs};
}

// The row's time over f32's at the same context and query block (over the first format's when
// f32 is not an arm).
double RatioToF32(const std::vector<AttentionBenchRow>& rows, const AttentionBenchRow& r) {
  const AttentionBenchRow* base = nullptr;
  for (const AttentionBenchRow& x : rows) {
    if (x.context != r.context || x.query_block != r.query_block) continue;
    if (base == nullptr || x.format == "f32") base = &x;
    if (x.format == "f32") break;
  }
  return r.ns_per_step / base->ns_per_step;
}

// The arm of r's format without transforms at the same context and query block (always in the
// run: RunBenchAttention adds it), or null for a plain arm.
const AttentionBenchRow* PlainArm(const std::vector<AttentionBenchRow>& rows, const AttentionBenchRow& r) {
  if (!r.spec.transforms.any()) return nullptr;
  for (const AttentionBenchRow& x : rows) {
    if (x.context == r.context && x.query_block == r.query_block && x.spec == KvSpec{r.spec.format, {}}) return &x;
  }
  return nullptr;
}

// The row's time over that of the same format and context with the first --query-block given.
double RatioToFirstBlock(const std::vector<AttentionBenchRow>& rows, const AttentionBenchRow& r) {
  for (const AttentionBenchRow& x : rows) {
    if (x.context == r.context && x.format == r.format) return r.ns_per_step / x.ns_per_step;
  }
  return 1.0;
}

int RunBenchAttention(const BenchAttentionOptions& o) {
  auto bad = [](const std::string& m) { return BadInput("bench attention", m); };
  if (o.kv_heads.empty()) return bad("--kv-heads needs at least one count");
  for (int64_t kv : o.kv_heads) {
    if (kv <= 0 || kv > 4096) return bad(fmt::format("--kv-heads must each be in 1..4096 (got {})", kv));
    if (o.q_heads <= 0 || o.q_heads % kv != 0) {
      return bad(fmt::format("--q-heads must be a positive multiple of --kv-heads {} (got {})", kv, o.q_heads));
    }
  }
  const int64_t most_kv_heads = *std::max_element(o.kv_heads.begin(), o.kv_heads.end());
  if (o.reps <= 0 || o.reps > 10000) return bad(fmt::format("--reps must be in 1..10000 (got {})", o.reps));
  for (int64_t n : o.shared.contexts) {
    if (o.queries > n) return bad(fmt::format("--queries {} exceeds --context {}: the queries sit at its last positions", o.queries, n));
  }
  AttentionBenchConfig c;
  c.shape = {.n_heads = static_cast<int32_t>(o.q_heads), .n_kv_heads = static_cast<int32_t>(most_kv_heads),
             .head_dim = static_cast<int32_t>(o.head_dim)};
  c.threads = o.shared.threads;
  c.reps = static_cast<int32_t>(o.reps);
  c.queries = static_cast<int32_t>(o.queries);
  c.query_blocks.assign(o.query_blocks.begin(), o.query_blocks.end());
  const Result<std::vector<KvSpec>> specs = o.shared.FormatList();
  if (!specs.ok()) return bad(specs.status().message());
  for (const KvSpec& s : *specs) {
    for (int64_t kv : o.kv_heads) {
      const RowShape row{.n_kv_heads = static_cast<int32_t>(kv), .head_dim = c.shape.head_dim};
      if (Status st = CheckKvSpec(s, row); !st.ok()) return bad("--format: " + st.message());
    }
    if (std::find(c.specs.begin(), c.specs.end(), s) == c.specs.end()) c.specs.push_back(s);
  }
  // A transform's cost is read against its plain format in the same run: add the plain arm of
  // every transformed spec that lacks one.
  std::vector<std::string> added;
  for (size_t i = 0, given = c.specs.size(); i < given; ++i) {
    const KvSpec plain{c.specs[i].format, {}};
    if (std::find(c.specs.begin(), c.specs.end(), plain) == c.specs.end()) {
      c.specs.push_back(plain);
      added.push_back(KvSpecName(plain));
    }
  }
  c.contexts = o.shared.contexts;
  const int64_t largest = c.contexts.empty() ? 0 : *std::max_element(c.contexts.begin(), c.contexts.end());
  // The K + V of the widest arm at the largest context, for each arm alive at once.
  const int64_t f32_bytes = largest * c.shape.n_kv_heads * c.shape.head_dim * 4 * 2;
  if (f32_bytes * static_cast<int64_t>(c.specs.size()) > (int64_t{16} << 30)) {
    return bad(fmt::format("the arms would hold about {} of KV at context {}: use fewer formats or a "
                           "smaller context", FormatBytesIec(f32_bytes * static_cast<int64_t>(c.specs.size())),
                           largest));
  }

  // Ceiling first: a buffer 4x the largest f32 KV (at least 512 MiB) defeats the caches.
  const int64_t bw_bytes = std::max<int64_t>(kMinReadBandwidthBytes, std::min<int64_t>(4 * f32_bytes, int64_t{2} << 30));
  if (!o.shared.json) fmt::print(stderr, "measuring read bandwidth over {} on {} threads...\n", FormatBytesIec(bw_bytes), c.threads);
  const double read_gbps = MeasureReadBandwidthGbps(bw_bytes, c.threads, 5);
  if (!o.shared.json) fmt::print(stderr, "measuring f32 FMA and int8 dot peaks on {} threads...\n", c.threads);
  const ComputeRoofline peak = MeasureComputeRoofline(c.threads, 5);
  auto progress = [&](const std::string& line) { fmt::print(stderr, "bench attention: {}\n", line); };
  std::vector<std::vector<AttentionBenchRow>> tables;  // [kv_heads given]: that count's rows
  for (int64_t kv : o.kv_heads) {
    c.shape.n_kv_heads = static_cast<int32_t>(kv);
    const Result<std::vector<AttentionBenchRow>> run = RunAttentionBench(c, progress);
    if (!run.ok()) return bad(run.status().message());
    tables.push_back(*run);
  }

  if (o.shared.json) {
    nlohmann::json out = {{"isa", AttentionSimdTarget()}, {"score_arithmetic", ScoreArithmeticLabel()},
                          {"threads", c.threads}, {"head_dim", o.head_dim}, {"q_heads", o.q_heads},
                          {"kv_heads", o.kv_heads}, {"read_bandwidth_gbps", read_gbps},
                          {"peak_f32_gmacs", peak.best_f32_gmacs}, {"peak_f32_instruction", peak.best_f32_instruction},
                          {"peak_int8_gmacs", peak.best_int8_gmacs},
                          {"peak_int8_instruction", peak.best_int8_instruction}, {"queries", c.queries},
                          {"fill", "random rows appended to a one-layer KvCache of each spec"},
                          {"step", "KvCache::Attend + KvCache::FinishAttention (q rotation, V unrotation included)"},
                          {"pages", "resident, DefaultPagePositions(context) positions each (256, or the context rounded up to 32)"},
                          {"plain_arms_added", added}, {"results", nlohmann::json::array()}};
    for (size_t t = 0; t < tables.size(); ++t) {
      const std::vector<AttentionBenchRow>& rows = tables[t];
      for (const AttentionBenchRow& r : rows) {
        const Floor f = RowFloor(r, read_gbps, peak);
        const AttentionBenchRow* plain = PlainArm(rows, r);
        out["results"].push_back({{"format", r.format}, {"kv_heads", o.kv_heads[t]}, {"context", r.context},
                                  {"queries", r.queries},
                                  {"query_block", r.query_block}, {"ns_per_step", r.ns_per_step},
                                  {"ns_min", r.ns_min}, {"ns_max", r.ns_max}, {"kv_bytes", r.kv_bytes},
                                  {"gbps", r.gbps}, {"score_macs", r.score_macs}, {"value_macs", r.value_macs},
                                  {"int8_scores", r.int8_scores}, {"bytes_floor_ns", f.bytes_ns},
                                  {"macs_floor_ns", f.macs_ns}, {"time_over_floor", r.ns_per_step / f.ns()},
                                  {"vs_f32", RatioToF32(rows, r)},
                                  {"plain_format", plain ? nlohmann::json(plain->format) : nlohmann::json(nullptr)},
                                  {"vs_plain", plain ? nlohmann::json(r.ns_per_step / plain->ns_per_step)
                                                     : nlohmann::json(nullptr)},
                                  {"transform_ns", plain ? nlohmann::json(r.ns_per_step - plain->ns_per_step)
                                                         : nlohmann::json(nullptr)},
                                  {"min_vs_plain", plain ? nlohmann::json(r.ns_min / plain->ns_min)
                                                         : nlohmann::json(nullptr)}});
      }
    }
    PrintJson(out);
    return 0;
  }
  std::string kv_list;
  for (int64_t kv : o.kv_heads) kv_list += (kv_list.empty() ? "" : ", ") + std::to_string(kv);
  fmt::print("{}: {} query heads, {} KV heads, head_dim {}, {} threads, SIMD target {}, int8/int4 scores {}\n",
             c.queries == 1 ? "decode attention" : fmt::format("prefill attention, {} query tokens at the context's end", c.queries),
             o.q_heads, kv_list, o.head_dim, c.threads, AttentionSimdTarget(), ScoreArithmeticLabel());
  fmt::print("measured in this run: read bandwidth {:.1f} GB/s, f32 FMA peak {:.1f} GMAC/s ({}), int8 dot peak "
             "{:.1f} GMAC/s ({}); cache filled with random rows\n",
             read_gbps, peak.best_f32_gmacs, peak.best_f32_instruction, peak.best_int8_gmacs, peak.best_int8_instruction);
  fmt::print("each arm a one-layer KvCache of its spec (resident, {}-position pages at the largest context); a step = "
             "KvCache::Attend + FinishAttention, so a rotated spec's q rotation and V unrotation are timed; KV bytes "
             "include f32 sink and residual rows\n",
             DefaultPagePositions(largest));
  if (!added.empty()) {
    std::string list;
    for (const std::string& a : added) list += (list.empty() ? "" : ", ") + a;
    fmt::print("plain arms added so each transform's cost is read in this run: {}\n", list);
  }
  fmt::print("vs plain = median time over the same format's without transforms (same context, block); +us = the "
             "difference; min vs = the same ratio of the fastest steps (less exposed to a shared machine's load)\n");
  fmt::print("floor = max(KV bytes / bandwidth, multiply-adds / peak; integer-scored formats' score half at the "
             "int8 peak); block 0 = the default ({})\n\n",
             kDefaultQueryBlock);
  for (size_t t = 0; t < tables.size(); ++t) {
    const std::vector<AttentionBenchRow>& rows = tables[t];
    if (tables.size() > 1) fmt::print("{}{} KV heads:\n", t == 0 ? "" : "\n", o.kv_heads[t]);
    size_t width = 10;
    for (const AttentionBenchRow& r : rows) width = std::max(width, r.format.size());
    fmt::print("{:<{}} {:>7} {:>5} {:>11} {:>19} {:>12} {:>7} {:>6} {:>10} {:>10} {:>7} {:>7} {:>8} {:>8} {:>8} {:>8}\n",
               "format", width, "context", "block", "us/step", "min-max us", "KV bytes", "GB/s", "of bw", "bytes us",
               "MACs us", "/floor", "vs f32", "vs 1st b", "vs plain", "+us", "min vs");
    for (const AttentionBenchRow& r : rows) {
      const Floor f = RowFloor(r, read_gbps, peak);
      const AttentionBenchRow* plain = PlainArm(rows, r);
      fmt::print("{:<{}} {:>7} {:>5} {:>11.1f} {:>19} {:>12} {:>7.2f} {:>5.0f}% {:>10.1f} {:>10.1f} {:>6.2f}x {:>6.3f}x "
                 "{:>7.3f}x {:>8} {:>8} {:>8}\n",
                 r.format, width, r.context, r.query_block, r.ns_per_step / 1e3,
                 fmt::format("{:.1f}-{:.1f}", r.ns_min / 1e3, r.ns_max / 1e3), FormatCount(r.kv_bytes), r.gbps,
                 100.0 * r.gbps / read_gbps, f.bytes_ns / 1e3, f.macs_ns / 1e3,
                 r.ns_per_step / f.ns(), RatioToF32(rows, r), RatioToFirstBlock(rows, r),
                 plain ? fmt::format("{:.3f}x", r.ns_per_step / plain->ns_per_step) : std::string("-"),
                 plain ? fmt::format("{:+.1f}", (r.ns_per_step - plain->ns_per_step) / 1e3) : std::string("-"),
                 plain ? fmt::format("{:.3f}x", r.ns_min / plain->ns_min) : std::string("-"));
    }
  }
  return 0;
}

struct BenchStreamOptions {
  SharedOptions shared{.formats = {"f16", "int4"}, .contexts = {16384, 65536}};
  int64_t head_dim = 128;
  int64_t q_heads = 32;
  int64_t kv_heads = 8;
  int64_t page = 256;
  int64_t device_budget = int64_t{8} << 20;
  int64_t reps = 7;
};

int RunBenchStream(const BenchStreamOptions& o) {
  auto bad = [](const std::string& m) { return BadInput("bench stream", m); };
  if (o.kv_heads <= 0 || o.q_heads <= 0 || o.q_heads % o.kv_heads != 0) {
    return bad("--q-heads must be a positive multiple of --kv-heads");
  }
  if (o.reps <= 0 || o.reps > 1000) return bad("--reps must be in 1..1000");
  StreamBenchConfig c;
  c.shape = {.n_heads = static_cast<int32_t>(o.q_heads), .n_kv_heads = static_cast<int32_t>(o.kv_heads),
             .head_dim = static_cast<int32_t>(o.head_dim)};
  c.threads = o.shared.threads;
  c.page_positions = static_cast<int32_t>(o.page);
  c.device_bytes = o.device_budget;
  c.reps = static_cast<int32_t>(o.reps);
  c.contexts = o.shared.contexts;
  const Result<std::vector<const FormatDesc*>> formats = o.shared.PlainFormatList();
  if (!formats.ok()) return bad(formats.status().message());
  c.formats = *formats;
  auto progress = [](const std::string& line) { fmt::print(stderr, "bench stream: {}\n", line); };
  const Result<std::vector<StreamBenchRow>> rows = RunStreamBench(c, progress);
  if (!rows.ok()) return bad(rows.status().message());
  if (o.shared.json) {
    nlohmann::json out = {{"isa", AttentionSimdTarget()}, {"threads", c.threads}, {"page_positions", c.page_positions},
                          {"device_budget_bytes", c.device_bytes}, {"results", nlohmann::json::array()}};
    for (const StreamBenchRow& r : *rows) {
      out["results"].push_back({{"format", r.format}, {"context", r.context}, {"kv_bytes", r.kv_bytes},
                                {"device_slots", r.device_slots}, {"device_peak_bytes", r.device_peak_bytes},
                                {"resident_ns", r.resident_ns}, {"streamed_ns", r.streamed_ns},
                                {"copy_ns", r.copy_ns}, {"streamed_vs_resident", r.streamed_ns / r.resident_ns}});
    }
    PrintJson(out);
    return 0;
  }
  fmt::print("decode attention, resident vs streamed through a {} working set ({} positions per page), "
             "{} query heads, {} KV heads, head_dim {}, {} threads, SIMD {}\n\n",
             FormatBytesIec(c.device_bytes), c.page_positions, o.q_heads, o.kv_heads, o.head_dim, c.threads,
             AttentionSimdTarget());
  fmt::print("{:<8} {:>8} {:>12} {:>6} {:>12} {:>12} {:>12} {:>10} {:>12}\n", "format", "context", "KV bytes",
             "slots", "resident us", "streamed us", "copy us", "streamed/", "serial would");
  fmt::print("{:<8} {:>8} {:>12} {:>6} {:>12} {:>12} {:>12} {:>10} {:>12}\n", "", "", "", "", "", "", "alone",
             "resident", "be (us)");
  for (const StreamBenchRow& r : *rows) {
    fmt::print("{:<8} {:>8} {:>12} {:>6} {:>12.0f} {:>12.0f} {:>12.0f} {:>9.3f}x {:>12.0f}\n", r.format, r.context,
               FormatCount(r.kv_bytes), r.device_slots, r.resident_ns / 1e3, r.streamed_ns / 1e3, r.copy_ns / 1e3,
               r.streamed_ns / r.resident_ns, (r.resident_ns + r.copy_ns) / 1e3);
  }
  return 0;
}

}  // namespace

std::string ScoreArithmeticLabel() {
  if (GetScoreArithmetic() == ScoreArithmetic::kF32) return "f32";
  return fmt::format("int ({})", int_score::PathName(int_score::Best()));
}

void AddBenchCommand(CLI::App& app, int* exit_code) {
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks that print numbers");  // the list: at the end
  bench->require_subcommand(1);
  auto o = std::make_shared<BenchAttentionOptions>();
  CLI::App* cmd = bench->add_subcommand("attention", "Decode-attention time per KV spec vs context");
  AddFormatListFlag(cmd, &o->shared, "--format,--formats",
                    "KV specs (FORMAT[+rot][+sinkN][+resN]), comma-separated; run as interleaved arms, with the plain "
                    "format of each transformed spec");
  AddScoreArithmeticFlag(cmd);
  AddContextListFlag(cmd, &o->shared, "--context", "Context lengths, comma-separated", 1, kMaxAttentionContext);
  AddHeadDimFlag(cmd, &o->head_dim);
  cmd->add_option("--q-heads", o->q_heads, "Query heads")->capture_default_str();
  cmd->add_option("--kv-heads", o->kv_heads, "KV heads, comma-separated; each count its own table")
      ->delimiter(',')
      ->capture_default_str();
  AddThreadsFlag(cmd, &o->shared);
  cmd->add_option("--reps", o->reps, "Timed steps per format and context (median reported)")->capture_default_str();
  cmd->add_option("--queries", o->queries,
                  "Query tokens per step, at the context's last positions (1: decode; more: a prefill block)")
      ->check(IntInRange(1, 65536))
      ->capture_default_str();
  cmd->add_option("--query-block", o->query_blocks,
                  "Query tokens per work item, comma-separated, each its own arm (0: the default; 1: per token)")
      ->delimiter(',')
      ->check(IntInRange(0, 4096))
      ->capture_default_str();
  AddJsonFlag(cmd, &o->shared);
  cmd->callback([o, exit_code] { *exit_code = RunBenchAttention(*o); });

  auto so = std::make_shared<BenchStreamOptions>();
  CLI::App* stream = bench->add_subcommand(
      "stream", "Decode attention streamed through a device working set vs resident");
  AddFormatListFlag(stream, &so->shared, "--format,--formats", "KV formats, comma-separated");
  AddContextListFlag(stream, &so->shared, "--context", "Context lengths, comma-separated", 1, kMaxStreamContext);
  AddByteSizeFlag(stream, "--kv-device-budget", &so->device_budget, "Working-set budget (e.g. 64MiB)")
      ->default_str("8MiB");
  stream->add_option("--page", so->page, "Positions per page (multiple of 32)")->capture_default_str();
  AddHeadDimFlag(stream, &so->head_dim);
  stream->add_option("--q-heads", so->q_heads, "Query heads")->capture_default_str();
  stream->add_option("--kv-heads", so->kv_heads, "KV heads")->capture_default_str();
  AddThreadsFlag(stream, &so->shared, "Attention threads (the copy thread is extra)");
  stream->add_option("--reps", so->reps, "Timed steps per arm (median reported)")->capture_default_str();
  AddJsonFlag(stream, &so->shared);
  stream->callback([so, exit_code] { *exit_code = RunBenchStream(*so); });

  AddBenchMatvecCommand(*bench, exit_code);
  AddBenchDecodeCommand(*bench, exit_code);
  AddBenchPrefillCommand(*bench, exit_code);
  AddBenchRooflineCommand(*bench, exit_code);
  AddBenchContextCommand(*bench, exit_code);
  AddBenchServeCommand(*bench, exit_code);
  AddBenchBatchCommand(*bench, exit_code);
  AddBenchGrammarCommand(*bench, exit_code);
  AddBenchSpecCommand(*bench, exit_code);
  // The description lists the subcommands as added, so a new one is never left out.
  std::string names;
  for (const CLI::App* sub : bench->get_subcommands([](CLI::App*) { return true; })) {
    names += (names.empty() ? "" : ", ") + sub->get_name();
  }
  bench->description(fmt::format("Benchmarks that print numbers ({})", names));
}

}  // namespace kvq::cli
