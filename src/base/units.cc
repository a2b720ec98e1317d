// Byte-size parsing and printing; see kvq/units.h.
#include "kvq/units.h"

#include <fmt/format.h>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>

namespace kvq {

bool CheckedMul(int64_t a, int64_t b, int64_t* out) { return !__builtin_mul_overflow(a, b, out); }
bool CheckedAdd(int64_t a, int64_t b, int64_t* out) { return !__builtin_add_overflow(a, b, out); }

Result<int64_t> ParseByteSize(std::string_view text) {
  auto bad = [&](std::string_view why) {
    return Status::Error(fmt::format("invalid size '{}': {} (expected e.g. 4096, 512MiB, 718MB, 2GiB)",
                                     text, why));
  };
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  const std::string number(text.substr(0, i));
  std::string unit;
  for (char c : text.substr(i)) {
    if (c != ' ') unit += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  if (!text.empty() && text[0] == '-') return bad("sizes must be positive");
  if (number.empty() || number == ".") return bad("no number");
  if (number.find('.') != number.rfind('.')) return bad("malformed number");

  struct Unit {
    const char* name;
    double factor;
  };
  static constexpr Unit kUnits[] = {
      {"", 1.0},           {"b", 1.0},
      {"k", 1e3},          {"kb", 1e3},        {"m", 1e6},          {"mb", 1e6},
      {"g", 1e9},          {"gb", 1e9},        {"t", 1e12},         {"tb", 1e12},
      {"kib", 1024.0},     {"mib", 1048576.0}, {"gib", 1073741824.0},
      {"tib", 1099511627776.0},
  };
  const Unit* found = nullptr;
  for (const Unit& u : kUnits) {
    if (unit == u.name) found = &u;
  }
  if (found == nullptr) return bad(fmt::format("unknown unit '{}'", text.substr(i)));
  if (found->factor == 1.0 && number.find('.') != std::string::npos) {
    return bad("a plain byte count must be a whole number");
  }
  if (found->factor == 1.0) {
    errno = 0;
    char* end = nullptr;
    const long long v = std::strtoll(number.c_str(), &end, 10);
    if (errno == ERANGE) return bad("larger than 2^63 - 1 bytes");
    if (v <= 0) return bad("sizes must be greater than zero");
    return static_cast<int64_t>(v);
  }
  const double bytes = std::round(std::strtod(number.c_str(), nullptr) * found->factor);
  if (!(bytes < 9.2e18)) return bad("larger than 2^63 - 1 bytes");
  if (bytes <= 0) return bad("sizes must be greater than zero");
  return static_cast<int64_t>(bytes);
}

std::string FormatCount(int64_t n) {
  // The magnitude in uint64: -n is undefined for INT64_MIN (fuzz/regressions/parsers/).
  const uint64_t magnitude = n < 0 ? uint64_t{0} - static_cast<uint64_t>(n) : static_cast<uint64_t>(n);
  std::string digits = std::to_string(magnitude);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return n < 0 ? "-" + out : out;
}

std::string FormatBytesIec(int64_t bytes) {
  static constexpr const char* kNames[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = static_cast<double>(bytes);
  int k = 0;
  while (v >= 1024.0 && k < 6) {
    v /= 1024.0;
    ++k;
  }
  if (k == 0) return fmt::format("{} B", bytes);
  return fmt::format("{:.2f} {}", v, kNames[k]);
}

}  // namespace kvq
