// The weight registry's entries synth writes matrices with. Apart from synth.h because they are
// the weight layer's types: synth.h, the entry point the CLI calls, takes public and standard
// types only (the CLI sees include/ and synth/, not weights/). For synth's own sources, its tests
// and the fuzz corpus, which link the weight layer.
#pragma once

#include <string_view>

#include "gguf/gguf_reader.h"
#include "kvq/status.h"
#include "weights/weight_type.h"

namespace kvq {

/// The registry entry synth writes `type` with, or null when it cannot (not registered, or no
/// reference quantiser).
const WeightTypeDesc* SynthWeightType(GgmlType type);
/// The registry entry synth writes the type named `name` with; the error names the type and says
/// whether it is unregistered or has no reference quantiser.
Result<const WeightTypeDesc*> SynthWeightTypeByName(std::string_view name);

}  // namespace kvq
