// THE format table. Adding a format: a folder under src/format/, one FormatId line in
// include/kvq/format.h, one line here. Listings, tests, plans and benches iterate this table.
#include <fmt/format.h>

#include <array>

#include "formats/bf16/bf16.h"
#include "formats/f16/f16.h"
#include "formats/f32/f32.h"
#include "formats/fp4_e2m1/fp4_e2m1.h"
#include "formats/fp8_e4m3/fp8_e4m3.h"
#include "formats/int_token/int_token.h"
#include "formats/kivi/kivi.h"
#include "kvq/format.h"

namespace kvq {
// A function-local static, so the table is ready even when another translation unit's static
// initialiser asks for it first (benchmarks register per format at start-up).
std::span<const FormatDesc* const> Formats() {
  static const std::array<const FormatDesc*, 10> kRegistry = {
      &F32Format(),      &F16Format(),      &Bf16Format(), &Fp8E4m3Format(),
      &Int8Format(),     &Int4Format(),     &Int2Format(), &Int4KiviFormat(),
      &Int2KiviFormat(), &Fp4E2m1Format(),
  };
  return kRegistry;
}

Result<const FormatDesc*> FindFormat(std::string_view name) {
  std::string known;
  for (const FormatDesc* f : Formats()) {
    if (name == f->name) return f;
    known += known.empty() ? f->name : fmt::format(", {}", f->name);
  }
  return Status::Error(fmt::format("unknown KV format '{}' (known: {})", name, known));
}

const FormatDesc* FindFormat(FormatId id) {
  for (const FormatDesc* f : Formats()) {
    if (f->id == id) return f;
  }
  return nullptr;
}

}  // namespace kvq
