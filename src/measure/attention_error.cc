// Attention error vs context (see attention_error.h). Both row sources reduce to the same
// capture — K and V of every position per layer, q at each query position — and the same
// comparison; the model adds its own attention output as the reference and the top-1 rerun.
// Candidates are KV specs: a format and its transforms, applied by the KvCache itself.
#include "measure/attention_error.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <numeric>
#include <random>

#include "formats/transforms/hadamard.h"
#include "kvq/kv_cache.h"
#include "model/cache_config.h"

namespace kvq {
namespace {

Status Bad(const std::string& message) { return Status::Error("eval attention: " + message); }

// What every measurement reads. K and V are kept for every position (a context's cache is a
// prefix of them); q and the reference only at the positions queries sit at.
struct Captured {
  SyntheticShape shape;              // n_layers: the layers with KV (a hybrid's attention layers)
  std::vector<int32_t> model_layer;  // [layer] the model's index of each (synthetic rows: the same)
  std::vector<std::vector<float>> k, v;                   // [layer][position][kv_dim]
  std::map<int64_t, std::vector<float>> q;                // query position -> [layer][q_dim]
  std::map<int64_t, std::vector<float>> model_reference;  // query position -> [layer][q_dim] (model only)
  std::map<int64_t, int32_t> model_top1;                  // query position -> argmax of the f32 logits
  // query position -> [state_floats] a hybrid's recurrent state before that position's token (the
  // top-1 rerun starts from it: a state cannot be rebuilt from K and V). Empty without one.
  std::map<int64_t, std::vector<float>> model_state;
  int64_t kv_dim() const { return int64_t{shape.n_kv_heads} * shape.head_dim; }
  int64_t q_dim() const { return int64_t{shape.n_heads} * shape.head_dim; }
  AttentionShape attention_shape() const {
    return {.n_heads = shape.n_heads, .n_kv_heads = shape.n_kv_heads, .head_dim = shape.head_dim};
  }
};

// Which layers and which part of each layer's output [n_heads][head_dim] are measured.
struct Selection {
  std::vector<int32_t> layers;
  int64_t begin = 0, end = 0;  // element range of the output
};

Selection Select(const SyntheticShape& shape, const AttentionErrorConfig& config) {
  Selection s;
  if (config.layer >= 0) {
    s.layers = {config.layer};
  } else {
    s.layers.resize(shape.n_layers);
    std::iota(s.layers.begin(), s.layers.end(), 0);
  }
  const int64_t hd = shape.head_dim;
  s.begin = config.head >= 0 ? config.head * hd : 0;
  s.end = config.head >= 0 ? s.begin + hd : int64_t{shape.n_heads} * hd;
  return s;
}

int64_t QueryPosition(const AttentionErrorConfig& config, int64_t context) {
  return config.inject_query_at_position_zero ? 0 : context - 1;
}

Status Validate(const SyntheticShape& shape, const AttentionErrorConfig& config, int64_t max_context,
                const char* context_owner) {
  if (config.formats.empty()) return Bad("no formats to measure");
  if (config.contexts.empty()) return Bad("no contexts to measure");
  for (size_t i = 0; i < config.contexts.size(); ++i) {
    const int64_t n = config.contexts[i];
    if (n < 1) return Bad(fmt::format("context {} must be at least 1", n));
    if (i > 0 && n <= config.contexts[i - 1]) {
      return Bad(fmt::format("contexts must be strictly ascending ({} follows {})", n, config.contexts[i - 1]));
    }
    if (n > max_context) {
      return Bad(fmt::format("context {} is past {} of {} positions", n, context_owner, max_context));
    }
  }
  if (config.layer < -1 || config.layer >= shape.n_layers) {
    return Bad(fmt::format("layer {} out of range: there are {} layers (0..{})", config.layer, shape.n_layers,
                           shape.n_layers - 1));
  }
  if (config.head < -1 || config.head >= shape.n_heads) {
    return Bad(fmt::format("head {} out of range: there are {} query heads (0..{})", config.head, shape.n_heads,
                           shape.n_heads - 1));
  }
  const RowShape row{.n_kv_heads = shape.n_kv_heads, .head_dim = shape.head_dim};
  for (const KvSpec& f : config.formats) {
    if (f.format == nullptr) return Bad("a spec without a format");
    if (Status s = CheckKvSpec(f, row); !s.ok()) return Bad(s.message());
  }
  return Status::Ok();
}

// The reference spec (a function: the format registry is not ours to order static initialisation by).
KvSpec F32Spec() { return {FindFormat(FormatId::kF32), {}}; }

// A cache of spec f (K and V alike) whose layer i holds rows 0..prefix−1 of model layer
// layers[i], appended as one block (as a prefill writes them), with room for `max_positions`.
Result<std::unique_ptr<KvCache>> PrefixCache(const Captured& c, const KvSpec& f, const std::vector<int32_t>& layers,
                                             int64_t prefix, int64_t max_positions) {
  KvCacheConfig config{.n_layers = static_cast<int64_t>(layers.size()), .n_kv_heads = c.shape.n_kv_heads,
                       .head_dim = c.shape.head_dim, .layers = {LayerFormats::Both(f)}, .max_positions = max_positions,
                       .page_positions = DefaultPagePositions(max_positions)};
  Result<std::unique_ptr<KvCache>> cache = KvCache::Create(config);
  if (!cache.ok()) return cache.status();
  for (size_t i = 0; i < layers.size() && prefix > 0; ++i) {
    const int32_t l = layers[i];
    if (Status s = (*cache)->Append(static_cast<int64_t>(i), c.k[l].data(), c.v[l].data(), prefix); !s.ok()) return s;
  }
  return std::move(cache.value());
}

// The attention output of the query at qpos over a cache of format f holding n positions, per
// selected layer [selection index][q_dim], and the fewest positions any of them attended.
struct Outputs {
  std::vector<std::vector<float>> out;
  int64_t attended = 0;
};

Result<Outputs> AttendCaptured(const Captured& c, const KvSpec& f, const Selection& sel, int64_t n, int64_t qpos,
                               const AttentionOptions& options) {
  Result<std::unique_ptr<KvCache>> cache = PrefixCache(c, f, sel.layers, n - 1, n);
  if (!cache.ok()) return cache.status();
  Outputs o;
  o.out.assign(sel.layers.size(), std::vector<float>(c.q_dim()));
  o.attended = n;
  AttentionState state(c.attention_shape(), 1);
  const std::vector<float>& q = c.q.at(qpos);
  for (size_t i = 0; i < sel.layers.size(); ++i) {
    const int32_t l = sel.layers[i];
    const int64_t last = (n - 1) * c.kv_dim();
    KvCache& kv = **cache;
    // The query's own row arrives alone, as the decode step at n − 1 appends it.
    if (Status s = kv.Append(static_cast<int64_t>(i), c.k[l].data() + last, c.v[l].data() + last, 1); !s.ok()) return s;
    state.Reset();
    if (Status s = kv.Attend(static_cast<int64_t>(i), options, q.data() + l * c.q_dim(), qpos, state); !s.ok()) {
      return s;
    }
    kv.FinishAttention(static_cast<int64_t>(i), state, o.out[i].data());
    o.attended = std::min(o.attended, state.attended[0]);
  }
  return o;
}

// 1 / Σ w² of the f32 softmax of the query at qpos over positions 0..qpos, averaged over the
// selected heads of the selected layers.
double EffectivePositions(const Captured& c, const Selection& sel, int64_t qpos, float scale) {
  const int32_t hd = c.shape.head_dim, group = c.shape.n_heads / c.shape.n_kv_heads;
  const std::vector<float>& q = c.q.at(qpos);
  std::vector<double> s(qpos + 1);
  double total = 0;
  int64_t count = 0;
  for (int32_t l : sel.layers) {
    for (int64_t h = sel.begin / hd; h < sel.end / hd; ++h) {
      const float* qh = q.data() + l * c.q_dim() + h * hd;
      double m = -INFINITY;
      for (int64_t p = 0; p <= qpos; ++p) {
        const float* k = c.k[l].data() + p * c.kv_dim() + (h / group) * hd;
        double dot = 0;
        for (int32_t i = 0; i < hd; ++i) dot += static_cast<double>(qh[i]) * k[i];
        s[p] = dot * scale;
        m = std::max(m, s[p]);
      }
      double sum = 0, sum_sq = 0;
      for (int64_t p = 0; p <= qpos; ++p) {
        const double e = std::exp(s[p] - m);
        sum += e;
        sum_sq += e * e;
      }
      total += sum * sum / sum_sq;
      ++count;
    }
  }
  return total / static_cast<double>(count);
}

AttentionErrorRow Compare(const Captured& c, const std::string& format, int64_t context, const Selection& sel,
                          const Outputs& candidate, const std::vector<std::vector<float>>& reference) {
  AttentionErrorRow row{.format = format, .context = context, .worst_layer = c.model_layer[sel.layers.front()],
                        .positions_attended = candidate.attended};
  double sum_of_means = 0, sum_of_reference = 0;
  for (size_t i = 0; i < sel.layers.size(); ++i) {
    double sum = 0;
    for (int64_t e = sel.begin; e < sel.end; ++e) {
      const double d = std::fabs(static_cast<double>(candidate.out[i][e]) - static_cast<double>(reference[i][e]));
      sum += d;
      sum_of_reference += std::fabs(reference[i][e]) / static_cast<double>(sel.end - sel.begin);
      row.max_abs_error = std::max(row.max_abs_error, d);
    }
    const double mean = sum / static_cast<double>(sel.end - sel.begin);
    sum_of_means += mean;
    if (mean > row.worst_layer_mean_abs_error) {
      row.worst_layer_mean_abs_error = mean;
      row.worst_layer = c.model_layer[sel.layers[i]];
    }
  }
  row.mean_abs_error = sum_of_means / static_cast<double>(sel.layers.size());
  row.reference_mean_abs = sum_of_reference / static_cast<double>(sel.layers.size());
  return row;
}

// Both elements f32: only rounding separates the candidate from the reference.
bool LosslessElements(const KvSpec& f) {
  return std::string_view(f.format->key.element) == "f32" && std::string_view(f.format->value.element) == "f32";
}

// A bound on |candidate − reference| over the measured outputs of the query at qpos when K and V
// are stored in f32 with transforms t (the same for K and V). Without rotation it is 0: sinks and the residual are the
// same f32 numbers read from another run, and windowed attention gives the bits of one window
// (docs/design.md §3). With rotation, to first order in u = 2⁻²⁴, per output element e of head h
// (weights w_p, output o and the norms from the rows, in double):
//   rotation, one direction: ‖fl(Rx) − Rx‖ ≤ ε‖x‖, ε = RotationRoundTripBound(d) / 2;
//   scores: q and k_p each rotated (2ε) and each side's f32 dot and scaling
//     ((d + 1)u per side): |δs_p| ≤ scale·‖q‖‖k_p‖·(2ε + 2(d + 1)u); each side's s − m and exp
//     add 2u|s_p − m| and 2η (η = 4u: Highway's Exp is tested to 1 ULP, taken 4 times over), and
//     a softcap's tanh 2·4u·softcap — call the sum ρ_p, a relative error of e_p;
//   weights: δw_p = w_p(ρ_p − Σ w ρ) and Σ w_p (v_pe − o_e) = 0, so |Σ δw_p v_pe| ≤
//     Σ w_p ρ_p |v_pe − o_e|;
//   V rotated: each row's rotation and the output's unrotation, ≤ 2ε Σ w_p ‖v_p‖;
//   accumulation, each side: acc = c·acc + e·v and l = c·l + e over n positions, then acc / l:
//     ≤ (5n + 4)u Σ w_p |v_pe| (the candidate's in the rotated basis, ≤ (5n + 4)u Σ w_p ‖v_p‖ after
//     the unrotation).
// A worst case (errors summed linearly), 1% added for second-order terms; a real error sits far
// below it, but one from a missing or mismatched rotation (of the order of |o|) far above.
double RoundingBound(const Captured& c, const Selection& sel, const KvTransforms& t, int64_t qpos,
                     const AttentionOptions& options) {
  if (!t.rotate) return 0;
  const double u = std::ldexp(1.0, -24), eta = 4 * u;
  const int32_t hd = c.shape.head_dim, group = c.shape.n_heads / c.shape.n_kv_heads;
  const double eps = RotationRoundTripBound(hd) / 2, scale = options.scale;
  const int64_t n = qpos + 1;
  const double acc = (5.0 * static_cast<double>(n) + 4.0) * u;
  const std::vector<float>& q = c.q.at(qpos);
  std::vector<double> s(n), w(n), vn(n), rho(n), o(hd);  // [position] ×4, [head_dim]
  double bound = 0;
  for (int32_t l : sel.layers) {
    for (int64_t h = sel.begin / hd; h < sel.end / hd; ++h) {
      const float* qh = q.data() + l * c.q_dim() + h * hd;
      const int64_t kv = (h / group) * hd;
      auto norm = [hd](const float* x) {
        double sum = 0;
        for (int32_t i = 0; i < hd; ++i) sum += static_cast<double>(x[i]) * x[i];
        return std::sqrt(sum);
      };
      const double qn = norm(qh);
      double m = -INFINITY, total = 0, sum_wvn = 0;
      for (int64_t p = 0; p < n; ++p) {
        const float* k = c.k[l].data() + p * c.kv_dim() + kv;
        double dot = 0;
        for (int32_t i = 0; i < hd; ++i) dot += static_cast<double>(qh[i]) * k[i];
        s[p] = dot * scale;
        if (options.softcap > 0) s[p] = options.softcap * std::tanh(s[p] / options.softcap);
        m = std::max(m, s[p]);
        rho[p] = scale * qn * norm(k) * (2 * eps + 2 * (hd + 1) * u) + 2 * eta + 8 * u * options.softcap;
      }
      for (int64_t p = 0; p < n; ++p) rho[p] += 2 * u * std::fabs(s[p] - m);
      for (int64_t p = 0; p < n; ++p) total += (w[p] = std::exp(s[p] - m));
      std::fill(o.begin(), o.end(), 0.0);
      for (int64_t p = 0; p < n; ++p) {
        const float* v = c.v[l].data() + p * c.kv_dim() + kv;
        w[p] /= total;
        vn[p] = norm(v);
        sum_wvn += w[p] * vn[p];
        for (int32_t i = 0; i < hd; ++i) o[i] += w[p] * v[i];
      }
      for (int32_t e = 0; e < hd; ++e) {
        double weights = 0, sum_wv = 0;
        for (int64_t p = 0; p < n; ++p) {
          const double ve = c.v[l][p * c.kv_dim() + kv + e];
          sum_wv += w[p] * std::fabs(ve);
          weights += w[p] * rho[p] * std::fabs(ve - o[e]);
        }
        const double b = weights + 2 * eps * sum_wvn + acc * (sum_wv + sum_wvn);
        bound = std::max(bound, b);
      }
    }
  }
  return bound * 1.01;
}

// Every (format, context) row against the references [context] -> [selection index][q_dim].
Result<std::vector<AttentionErrorRow>> MeasureRows(
    const Captured& c, const AttentionErrorConfig& config, const Selection& sel, const AttentionOptions& options,
    const std::map<int64_t, std::vector<std::vector<float>>>& references, const ProgressFn& progress) {
  std::map<int64_t, double> effective;
  for (int64_t n : config.contexts) effective[n] = EffectivePositions(c, sel, QueryPosition(config, n), options.scale);
  std::vector<AttentionErrorRow> rows;
  for (const KvSpec& f : config.formats) {
    const std::string name = KvSpecName(f);
    for (int64_t n : config.contexts) {
      const int64_t qpos = QueryPosition(config, n);
      Result<Outputs> candidate = AttendCaptured(c, f, sel, n, qpos, options);
      if (!candidate.ok()) return candidate.status();
      rows.push_back(Compare(c, name, n, sel, *candidate, references.at(n)));
      rows.back().effective_positions = effective[n];
      if (LosslessElements(f)) rows.back().rounding_bound = RoundingBound(c, sel, f.transforms, qpos, options);
    }
    if (progress) progress(fmt::format("{}: attention error measured at {} contexts", name, config.contexts.size()));
  }
  return rows;
}

AttentionErrorReport Finish(const AttentionErrorConfig& config, std::vector<AttentionErrorRow> rows) {
  AttentionErrorReport report;
  for (const KvSpec& f : config.formats) {
    const std::string name = KvSpecName(f);
    std::vector<int64_t> n;
    std::vector<double> e;
    for (const AttentionErrorRow& r : rows) {
      if (r.format == name) {
        n.push_back(r.context);
        e.push_back(r.mean_abs_error);
      }
    }
    report.slopes.emplace_back(name, LogLogSlope(n, e));
  }
  report.rows = std::move(rows);
  return report;
}

int32_t Argmax(const std::vector<float>& logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

// Runs tokens 0..N−1 through the model on an f32 cache, keeping K and V of every position and,
// at each query position, q, the attention output, the next token's top-1 and (a hybrid) the
// recurrent state the position started from. The hooks see model layers; the capture is per
// cache layer (DecoderConfig::cache_layer), as the cache holds them.
Result<Captured> CaptureModel(DecoderModel& model, std::span<const int32_t> tokens, int64_t n_positions,
                              const std::vector<int64_t>& query_positions, const ProgressFn& progress) {
  const DecoderConfig& mc = model.config();
  const FormatDesc* f32 = FindFormat(FormatId::kF32);
  Result<std::unique_ptr<KvCache>> cache = CreateModelCache(mc, n_positions, {.layers = {{f32, f32}}});
  if (!cache.ok()) return cache.status();
  Captured c;
  c.model_layer = ModelLayersOfCache(mc);
  const int32_t layers = static_cast<int32_t>(c.model_layer.size());
  c.shape = {.n_layers = layers, .n_heads = mc.n_heads, .n_kv_heads = mc.n_kv_heads, .head_dim = mc.head_dim()};
  c.k.assign(layers, std::vector<float>(n_positions * c.kv_dim()));
  c.v.assign(layers, std::vector<float>(n_positions * c.kv_dim()));
  for (int64_t p : query_positions) {
    c.q[p].resize(layers * c.q_dim());
    c.model_reference[p].resize(layers * c.q_dim());
  }
  ForwardHooks hooks;
  hooks.on_qkv = [&c, &mc](int32_t layer, int64_t pos, const float* q, const float* k, const float* v) {
    const int32_t l = mc.cache_layer(layer);
    std::copy(k, k + c.kv_dim(), c.k[l].data() + pos * c.kv_dim());
    std::copy(v, v + c.kv_dim(), c.v[l].data() + pos * c.kv_dim());
    if (auto it = c.q.find(pos); it != c.q.end()) std::copy(q, q + c.q_dim(), it->second.data() + l * c.q_dim());
  };
  hooks.on_attention_out = [&c, &mc](int32_t layer, int64_t pos, float* out) {
    if (auto it = c.model_reference.find(pos); it != c.model_reference.end()) {
      std::copy(out, out + c.q_dim(), it->second.data() + mc.cache_layer(layer) * c.q_dim());
    }
  };
  model.set_hooks(&hooks);
  std::vector<float> logits(mc.vocab_size);
  const int64_t report_every = std::max<int64_t>(1, n_positions / 4);
  KvCache& kv = **cache;
  for (int64_t p = 0; p < n_positions; ++p) {
    if (kv.state_floats() > 0 && c.q.count(p)) c.model_state[p].assign(kv.state(), kv.state() + kv.state_floats());
    if (Status s = model.Forward(tokens[p], p, kv, logits.data()); !s.ok()) {
      model.set_hooks(nullptr);
      return s;
    }
    if (c.q.count(p)) c.model_top1[p] = Argmax(logits);
    if (progress && ((p + 1) % report_every == 0 || p + 1 == n_positions)) {
      progress(fmt::format("f32 reference pass: {}/{} positions (q, k, v captured)", p + 1, n_positions));
    }
  }
  model.set_hooks(nullptr);
  return c;
}

// Reruns position n − 1 on an f32 cache of the captured prefix, replacing each selected layer's
// attention output (the selected elements) by the candidate's: attention of the live q over a
// cache of format f holding the captured prefix plus the live k and v. With one layer selected
// the live q, k, v equal the captured ones (the layers before it are f32), so the substitute is
// exactly the measured candidate.
Result<bool> Top1Changed(DecoderModel& model, const Captured& c, std::span<const int32_t> tokens, const KvSpec& f,
                         const Selection& sel, int64_t n) {
  // The base: the model's own f32 cache holding the captured prefix (and a hybrid's state there).
  const KvSpec f32 = F32Spec();
  Result<std::unique_ptr<KvCache>> base = CreateModelCache(model.config(), n, {.layers = {LayerFormats::Both(f32)}});
  if (!base.ok()) return base.status();
  for (int32_t l = 0; l < c.shape.n_layers && n > 1; ++l) {
    if (Status s = (*base)->Append(l, c.k[l].data(), c.v[l].data(), n - 1); !s.ok()) return s;
  }
  if (auto it = c.model_state.find(n - 1); it != c.model_state.end()) {
    std::copy(it->second.begin(), it->second.end(), (*base)->state());
  }
  Result<std::unique_ptr<KvCache>> candidate = PrefixCache(c, f, sel.layers, n - 1, n);
  if (!candidate.ok()) return candidate.status();
  // [model layer] the candidate cache's layer of each selected one, −1 elsewhere (the hooks see model layers).
  std::vector<int32_t> slot(model.config().n_layers, -1);
  for (size_t i = 0; i < sel.layers.size(); ++i) slot[c.model_layer[sel.layers[i]]] = static_cast<int32_t>(i);
  std::vector<std::vector<float>> substitute(sel.layers.size(), std::vector<float>(c.q_dim()));
  AttentionState state(c.attention_shape(), 1);
  const AttentionOptions options = model.attention_options();
  Status hook_status;
  KvCache& cand = **candidate;
  ForwardHooks hooks;
  hooks.on_qkv = [&](int32_t layer, int64_t pos, const float* q, const float* k, const float* v) {
    const int32_t i = slot[layer];
    if (i < 0 || !hook_status.ok()) return;
    Status s = cand.Append(i, k, v, 1);
    if (s.ok()) {
      state.Reset();
      s = cand.Attend(i, options, q, pos, state);
    }
    if (!s.ok()) {
      hook_status = s;
      return;
    }
    cand.FinishAttention(i, state, substitute[i].data());
  };
  hooks.on_attention_out = [&](int32_t layer, int64_t, float* out) {
    if (const int32_t i = slot[layer]; i >= 0) {
      std::copy(substitute[i].begin() + sel.begin, substitute[i].begin() + sel.end, out + sel.begin);
    }
  };
  model.set_hooks(&hooks);
  std::vector<float> logits(model.config().vocab_size);
  const Status s = model.Forward(tokens[n - 1], n - 1, **base, logits.data());
  model.set_hooks(nullptr);
  if (!s.ok()) return s;
  if (!hook_status.ok()) return hook_status;
  return Argmax(logits) != c.model_top1.at(n - 1);
}

// N(0, 1) numbers from a generator keyed by (seed, stream, a, b), so each block of numbers is
// the same whatever else is drawn.
std::mt19937_64 Stream(uint64_t seed, uint32_t stream, uint64_t a, uint64_t b) {
  std::seed_seq seq{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32), stream,
                    static_cast<uint32_t>(a), static_cast<uint32_t>(b), static_cast<uint32_t>(b >> 32)};
  return std::mt19937_64(seq);
}

}  // namespace

AttentionTextInput MakeAttentionTextInput(const Tokenizer& tokenizer, std::string_view text, int64_t n) {
  AttentionTextInput in;
  in.tokens = tokenizer.Encode(text, tokenizer.add_bos());
  in.text_tokens = static_cast<int64_t>(in.tokens.size());
  const std::vector<int32_t> again = tokenizer.Encode(text, false);
  while (static_cast<int64_t>(in.tokens.size()) < n && !again.empty()) {
    in.tokens.insert(in.tokens.end(), again.begin(), again.end());
    ++in.repeats;
  }
  if (static_cast<int64_t>(in.tokens.size()) > n) in.tokens.resize(static_cast<size_t>(n));
  return in;
}

Result<AttentionErrorReport> MeasureModelAttentionError(DecoderModel& model, std::span<const int32_t> tokens,
                                                        const AttentionErrorConfig& config,
                                                        const ProgressFn& progress) {
  const DecoderConfig& mc = model.config();
  // The rows measured are the cache's: a hybrid's attention layers (its recurrent layers hold no KV).
  const SyntheticShape shape{.n_layers = mc.n_attention_layers(), .n_heads = mc.n_heads,
                             .n_kv_heads = mc.n_kv_heads, .head_dim = mc.head_dim()};
  if (config.layer >= mc.n_layers || (config.layer >= 0 && mc.is_recurrent(config.layer))) {
    std::vector<int32_t> attending = ModelLayersOfCache(mc);
    return Bad(fmt::format("layer {} {}: the layers with attention (and KV) are {}", config.layer,
                           config.layer >= mc.n_layers ? fmt::format("is past the model's {} layers", mc.n_layers)
                                                       : std::string("is a recurrent layer, with no KV cache"),
                           fmt::join(attending, ", ")));
  }
  AttentionErrorConfig cache_config = config;  // the layer as the capture counts it: its cache layer
  if (config.layer >= 0) cache_config.layer = mc.cache_layer(config.layer);
  if (Status s = Validate(shape, cache_config, mc.seq_len, "the model's context"); !s.ok()) return s;
  const int64_t n_positions = config.contexts.back();
  if (static_cast<int64_t>(tokens.size()) < n_positions) {
    return Bad(fmt::format("{} tokens given, the largest context needs {}", tokens.size(), n_positions));
  }
  for (int64_t p = 0; p < n_positions; ++p) {
    if (tokens[p] < 0 || tokens[p] >= mc.vocab_size) {
      return Bad(fmt::format("token {} at position {} is outside the vocabulary of {}", tokens[p], p, mc.vocab_size));
    }
  }
  std::vector<int64_t> query_positions;
  for (int64_t n : config.contexts) query_positions.push_back(QueryPosition(config, n));
  Result<Captured> captured = CaptureModel(model, tokens, n_positions, query_positions, progress);
  if (!captured.ok()) return captured.status();
  const Captured& c = *captured;
  const Selection sel = Select(shape, cache_config);
  std::map<int64_t, std::vector<std::vector<float>>> references;
  for (int64_t n : config.contexts) {
    const std::vector<float>& all = c.model_reference.at(QueryPosition(config, n));
    for (int32_t l : sel.layers) references[n].emplace_back(all.begin() + l * c.q_dim(), all.begin() + (l + 1) * c.q_dim());
  }
  Result<std::vector<AttentionErrorRow>> rows =
      MeasureRows(c, config, sel, model.attention_options(), references, progress);
  if (!rows.ok()) return rows.status();
  // Refuse a broken fixture before spending reruns on it.
  if (Status s = CheckFixture(*rows); !s.ok()) return s;
  for (size_t i = 0; i < rows->size(); ++i) {
    AttentionErrorRow& r = rows.value()[i];
    // MeasureRows' order: per spec, every context.
    const KvSpec& spec = config.formats[i / config.contexts.size()];
    Result<bool> changed = Top1Changed(model, c, tokens, spec, sel, r.context);
    if (!changed.ok()) return changed.status();
    r.top1_changed = *changed;
  }
  if (progress) progress(fmt::format("top-1 reruns done ({} rows)", rows->size()));
  return Finish(config, std::move(rows.value()));
}

Result<AttentionErrorReport> MeasureSyntheticAttentionError(const SyntheticShape& shape, uint64_t seed,
                                                            const AttentionErrorConfig& config,
                                                            const ProgressFn& progress) {
  if (shape.n_layers < 1 || shape.n_kv_heads < 1 || shape.n_heads < 1 || shape.n_heads % shape.n_kv_heads != 0 ||
      shape.head_dim < 1 || shape.head_dim > kMaxHeadDim) {
    return Bad(fmt::format("synthetic shape {} layers, {} query heads, {} KV heads, head_dim {}: expected ≥ 1 "
                           "layer, query heads a multiple of KV heads, head_dim in 1..{}",
                           shape.n_layers, shape.n_heads, shape.n_kv_heads, shape.head_dim, kMaxHeadDim));
  }
  if (Status s = Validate(shape, config, int64_t{1} << 40, "the synthetic limit"); !s.ok()) return s;
  Captured c;
  c.shape = shape;
  c.model_layer.resize(shape.n_layers);
  std::iota(c.model_layer.begin(), c.model_layer.end(), 0);
  const int64_t n_positions = config.contexts.back();
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int32_t l = 0; l < shape.n_layers; ++l) {
    // K and V of position p come from one sequential stream per layer: a context's rows are a
    // prefix of a larger context's.
    std::mt19937_64 rng = Stream(seed, 0, static_cast<uint64_t>(l), 0);
    c.k.emplace_back(n_positions * c.kv_dim());
    c.v.emplace_back(n_positions * c.kv_dim());
    for (int64_t p = 0; p < n_positions; ++p) {
      for (int64_t e = 0; e < c.kv_dim(); ++e) c.k[l][p * c.kv_dim() + e] = normal(rng);
      for (int64_t e = 0; e < c.kv_dim(); ++e) c.v[l][p * c.kv_dim() + e] = normal(rng);
    }
  }
  for (int64_t n : config.contexts) {
    const int64_t p = QueryPosition(config, n);
    std::vector<float>& q = c.q[p];
    q.resize(shape.n_layers * c.q_dim());
    for (int32_t l = 0; l < shape.n_layers; ++l) {
      std::mt19937_64 rng = Stream(seed, 1, static_cast<uint64_t>(l), static_cast<uint64_t>(p));
      for (int64_t e = 0; e < c.q_dim(); ++e) q[l * c.q_dim() + e] = normal(rng);
    }
  }
  if (progress) progress(fmt::format("synthetic rows drawn: {} positions x {} layers (seed {})", n_positions,
                                     shape.n_layers, seed));
  const Selection sel = Select(shape, config);
  const AttentionOptions options{.scale = 1.0f / std::sqrt(static_cast<float>(shape.head_dim)),
                                 .kernel = AttentionKernel::kSimd, .threads = 1};
  std::map<int64_t, std::vector<std::vector<float>>> references;
  for (int64_t n : config.contexts) {
    Result<Outputs> ref = AttendCaptured(c, F32Spec(), sel, n, QueryPosition(config, n), options);
    if (!ref.ok()) return ref.status();
    references[n] = std::move(ref.value().out);
  }
  Result<std::vector<AttentionErrorRow>> rows = MeasureRows(c, config, sel, options, references, progress);
  if (!rows.ok()) return rows.status();
  if (Status s = CheckFixture(*rows); !s.ok()) return s;
  return Finish(config, std::move(rows.value()));
}

Status CheckFixture(std::span<const AttentionErrorRow> rows) {
  for (const AttentionErrorRow& r : rows) {
    if (r.positions_attended != r.context) {
      return Status::Error(fmt::format(
          "eval attention: fixture check failed: {} at context {} attended {} positions, expected {} (the query "
          "must sit at position context − 1 to attend to the whole cache)",
          r.format, r.context, r.positions_attended, r.context));
    }    if (r.rounding_bound && r.max_abs_error > *r.rounding_bound) {
      return Status::Error(
          *r.rounding_bound == 0
              ? fmt::format("eval attention: fixture check failed: {} at context {} has max abs error {} (mean {}); "
                            "its K and V are f32 without rotation, which must match the reference bit for bit",
                            r.format, r.context, r.max_abs_error, r.mean_abs_error)
              : fmt::format("eval attention: fixture check failed: {} at context {} has max abs error {} (mean {}), "
                            "past the bound {} that f32 rounding of its rotation allows",
                            r.format, r.context, r.max_abs_error, r.mean_abs_error, *r.rounding_bound));
    }
  }
  std::map<std::string, std::vector<const AttentionErrorRow*>> by_format;
  for (const AttentionErrorRow& r : rows) by_format[r.format].push_back(&r);
  for (const auto& [format, list] : by_format) {
    if (list.size() < 2) continue;
    const AttentionErrorRow& first = *list.front();
    bool any_nonzero = false, all_same = true;
    for (const AttentionErrorRow* r : list) {
      any_nonzero = any_nonzero || r->mean_abs_error != 0 || r->max_abs_error != 0;
      all_same = all_same && r->mean_abs_error == first.mean_abs_error && r->max_abs_error == first.max_abs_error;
    }
    if (any_nonzero && all_same) {
      return Status::Error(fmt::format(
          "eval attention: fixture check failed: {} gives mean abs error {} and max abs error {} at all {} contexts; "
          "identical numbers across context lengths mean the fixture measures one computation repeatedly",
          format, first.mean_abs_error, first.max_abs_error, list.size()));
    }
  }
  return Status::Ok();
}

std::optional<double> LogLogSlope(std::span<const int64_t> contexts, std::span<const double> errors) {
  if (contexts.size() != errors.size() || contexts.size() < 2) return std::nullopt;
  const double count = static_cast<double>(contexts.size());
  double mx = 0, my = 0;
  for (size_t i = 0; i < contexts.size(); ++i) {
    if (errors[i] <= 0 || contexts[i] <= 0) return std::nullopt;
    mx += std::log(static_cast<double>(contexts[i])) / count;
    my += std::log(errors[i]) / count;
  }
  double sxy = 0, sxx = 0;
  for (size_t i = 0; i < contexts.size(); ++i) {
    const double dx = std::log(static_cast<double>(contexts[i])) - mx;
    sxy += dx * (std::log(errors[i]) - my);
    sxx += dx * dx;
  }
  if (sxx == 0) return std::nullopt;
  return sxy / sxx;
}

}  // namespace kvq
