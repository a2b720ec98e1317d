// KV specs: parsing and printing "FORMAT+TRANSFORM..." and the exact byte rule of the transforms
// (see kvq/kv_spec.h).
#include "kvq/kv_spec.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <vector>

namespace kvq {
namespace {

constexpr const char* kTransformList = "rot, sinkN, resN, prerope";

// "sink4" with prefix "sink" -> 4; an error names the transform and the rule.
Result<int32_t> RowCount(std::string_view token, std::string_view prefix, std::string_view spec) {
  const std::string_view digits = token.substr(prefix.size());
  int32_t n = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), n);
  if (digits.empty() || ec != std::errc() || end != digits.data() + digits.size() || n <= 0 ||
      n > kMaxTransformRows) {
    return Status::Error(fmt::format("KV spec '{}': '{}' needs a whole number of positions from 1 "
                                     "to {} after '{}' (e.g. {}4)",
                                     spec, token, kMaxTransformRows, prefix, prefix));
  }
  return n;
}

}  // namespace

Result<KvSpec> ParseKvSpec(std::string_view text) {
  std::vector<std::string_view> parts;
  for (size_t start = 0;;) {
    const size_t plus = text.find('+', start);
    parts.push_back(text.substr(start, plus == std::string_view::npos ? plus : plus - start));
    if (plus == std::string_view::npos) break;
    start = plus + 1;
  }
  Result<const FormatDesc*> format = FindFormat(parts[0]);
  if (!format.ok()) {
    const std::string where = parts.size() == 1 ? "" : fmt::format("KV spec '{}': ", text);
    return Status::Error(fmt::format("{}{}; a spec is FORMAT[+TRANSFORM...] with transforms {}",
                                     where, format.status().message(), kTransformList));
  }
  KvSpec spec(*format);
  KvTransforms& t = spec.transforms;
  bool seen_rot = false;
  for (size_t i = 1; i < parts.size(); ++i) {
    const std::string_view p = parts[i];
    const auto twice = [&](std::string_view name) {
      return Status::Error(fmt::format("KV spec '{}': '{}' is given twice", text, name));
    };
    if (p == "rot") {
      if (seen_rot) return twice("rot");
      seen_rot = t.rotate = true;
    } else if (p == "prerope") {
      if (t.pre_rope) return twice("prerope");
      t.pre_rope = true;
    } else if (p.starts_with("sink")) {
      if (t.sinks > 0) return twice("sink");
      Result<int32_t> n = RowCount(p, "sink", text);
      if (!n.ok()) return n.status();
      t.sinks = *n;
    } else if (p.starts_with("res")) {
      if (t.residual > 0) return twice("res");
      Result<int32_t> n = RowCount(p, "res", text);
      if (!n.ok()) return n.status();
      t.residual = *n;
    } else {
      return Status::Error(fmt::format("KV spec '{}': unknown transform '{}' (known: {})", text,
                                       p, kTransformList));
    }
  }
  return spec;
}

std::string KvSpecName(const KvSpec& spec) {
  std::string s = spec.format ? spec.format->name : "?";
  const KvTransforms& t = spec.transforms;
  if (t.rotate) s += "+rot";
  if (t.sinks > 0) s += fmt::format("+sink{}", t.sinks);
  if (t.residual > 0) s += fmt::format("+res{}", t.residual);
  if (t.pre_rope) s += "+prerope";
  return s;
}

std::string LayerFormatsName(const LayerFormats& layer) {
  const std::string k = KvSpecName(layer.Key()), v = KvSpecName(layer.Value());
  return k == v ? k : k + "/" + v;
}

Status CheckKvSpec(const KvSpec& spec, RowShape shape) {
  if (spec.format == nullptr) return Status::Error("KV spec has no format");
  if (Status s = CheckShape(*spec.format, shape); !s.ok()) return s;
  const int32_t d = shape.head_dim;
  if (spec.transforms.rotate && (d & (d - 1)) != 0) {
    return Status::Error(fmt::format("KV spec {}: rot needs head_dim a power of two (the fast "
                                     "Walsh-Hadamard transform); this model's is {}",
                                     KvSpecName(spec), d));
  }
  if (spec.transforms.pre_rope && spec.transforms.rotate) {
    return Status::Error(fmt::format("KV spec {}: prerope and rot do not combine (the rotation "
                                     "would have to be undone before RoPE at every read); drop one",
                                     KvSpecName(spec)));
  }
  if (spec.transforms.pre_rope && d % 2 != 0) {
    return Status::Error(fmt::format("KV spec {}: prerope needs an even head_dim (RoPE rotates "
                                     "pairs); this model's is {}", KvSpecName(spec), d));
  }
  return Status::Ok();
}

Status CheckValueSpec(const KvSpec& spec, RowShape shape) {
  if (spec.transforms.pre_rope) {
    return Status::Error(fmt::format("KV spec {} for values: prerope is a key transform (RoPE "
                                     "rotates keys, never values)", KvSpecName(spec)));
  }
  return CheckKvSpec(spec, shape);
}

int64_t EncodedRows(const Codec& codec, const KvTransforms& t, int64_t n) {
  const int64_t aged = std::max<int64_t>(0, n - t.residual);
  return aged / codec.rows_per_block * codec.rows_per_block;
}

int64_t SpecBytesForRows(const Codec& codec, const KvTransforms& t, RowShape shape, int64_t n) {
  const int64_t encoded = EncodedRows(codec, t, n);
  const int64_t f32_rows = (n - encoded) + std::min<int64_t>(n, t.sinks);
  return encoded / codec.rows_per_block * codec.block_bytes(shape) + f32_rows * shape.elems() * 4;
}

std::string TransformsHelp() {
  return "  rot      randomized Hadamard rotation of each head before quantising (query rotated "
         "alike; V's undone on the output); head_dim a power of two\n"
         "  sinkN    the first N positions also kept in f32 and read from there (attention sinks)\n"
         "  resN     the newest N positions kept in f32, encoded as they age out (KIVI's residual)\n"
         "  prerope  keys stored before RoPE, RoPE applied to each dequantised key inside attention "
         "(KIVI, KVQuant); keys only (--kv applies it to K), not with rot\n";
}

}  // namespace kvq
