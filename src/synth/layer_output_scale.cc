// --layer-output-scale (synth.h's SynthLayerOutputScale): the flag's value read and checked, and
// which matrices it scales.
#include <fmt/format.h>

#include <charconv>
#include <cmath>

#include "synth/synth.h"
#include "synth/synth_tensors.h"

namespace kvq {

Result<SynthLayerOutputScale> ParseSynthLayerOutputScale(std::string_view value) {
  auto refuse = [&](std::string_view why) {
    return Status::Error(fmt::format("--layer-output-scale {}: {}", value, why));
  };
  constexpr std::string_view kSyntax = "expected FROM:SCALE, a layer number and a number >= 0 (e.g. 2:0.05)";
  const size_t colon = value.find(':');
  if (colon == std::string_view::npos) return refuse(kSyntax);
  const std::string_view from_text = value.substr(0, colon), scale_text = value.substr(colon + 1);
  SynthLayerOutputScale out;
  const auto [from_end, from_error] = std::from_chars(from_text.data(), from_text.data() + from_text.size(),
                                                      out.from_layer);
  if (from_text.empty() || from_error != std::errc() || from_end != from_text.data() + from_text.size()) {
    return refuse(fmt::format("FROM '{}' is not a layer number; {}", from_text, kSyntax));
  }
  if (out.from_layer < 0) return refuse("FROM must be a layer number, 0 or more");
  // from_chars reads "inf" and "nan" too: they are refused below with the other bad values.
  const auto [scale_end, scale_error] = std::from_chars(scale_text.data(), scale_text.data() + scale_text.size(),
                                                        out.scale, std::chars_format::general);
  if (scale_text.empty() || scale_text[0] == '+' || scale_error == std::errc::invalid_argument ||
      scale_end != scale_text.data() + scale_text.size()) {
    return refuse(fmt::format("SCALE '{}' is not a number; {}", scale_text, kSyntax));
  }
  if (scale_error == std::errc::result_out_of_range || !std::isfinite(out.scale)) {
    return refuse(fmt::format("SCALE '{}' must be a finite number", scale_text));
  }
  if (out.scale < 0.0f) return refuse(fmt::format("SCALE {} must be >= 0", out.scale));
  return out;
}

Status ValidateLayerOutputScale(const SynthSpec& s) {
  if (!s.layer_output_scale) return Status::Ok();
  const SynthLayerOutputScale& o = *s.layer_output_scale;
  if (o.from_layer < 0 || o.from_layer >= s.n_layers) {
    return Status::Error(fmt::format("--layer-output-scale {}:{}: FROM must be a layer of the model, 0..{} "
                                     "(--layers {})", o.from_layer, o.scale, s.n_layers - 1, s.n_layers));
  }
  if (!std::isfinite(o.scale) || o.scale < 0.0f) {
    return Status::Error(
        fmt::format("--layer-output-scale {}:{}: SCALE must be a finite number >= 0", o.from_layer, o.scale));
  }
  return Status::Ok();
}

float SynthOutputScale(const SynthSpec& s, const SynthTensorEntry& e) {
  const bool scaled = s.layer_output_scale && e.adds_to_residual && e.layer >= s.layer_output_scale->from_layer;
  return scaled ? s.layer_output_scale->scale : 1.0f;
}

}  // namespace kvq
