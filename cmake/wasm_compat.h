// Force-included in the Emscripten build only (cmake/wasm.cmake): Emscripten 3.1.6's libc++ lacks
// C++20's std::bit_cast, which kvq's float codes use; its clang 14 has the builtin that implements it.
#pragma once

#include <bit>
#include <type_traits>

#if !defined(__cpp_lib_bit_cast)
namespace std {
template <class To, class From>
  requires(sizeof(To) == sizeof(From) && is_trivially_copyable_v<To> && is_trivially_copyable_v<From>)
constexpr To bit_cast(const From& from) noexcept {
  return __builtin_bit_cast(To, from);
}
}  // namespace std
#endif
