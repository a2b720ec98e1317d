# SIMD target policy, in one place. Highway compiles each kernel for several targets and picks the
# best one the CPU supports at run time, so one binary runs on any x86-64 and uses AVX-512 where
# present. No -march flag is set. We keep AVX2 and AVX3 (AVX-512) and the portable fallback (with
# g++ 12 Highway uses HWY_SCALAR, as EMU128 is blocklisted for GCC < 12.3); SSSE3/SSE4 are dropped
# to bound compile time. The definition is PUBLIC so every translation unit that includes Highway
# agrees on the target set.
# The sanitizer build (KVQ_SANITIZE, CI's second pass) drops AVX3 instead of SSE4: AVX3's code
# paths are the AVX2 ones at another width (checked unsanitised by the first pass), while SSE4 is
# the one native 128-bit (4-lane) target — the width of WebAssembly SIMD128 and NEON, whose
# kernels (an 8-lane tag capped to 4 lanes) no other native target runs: a 4-lane bug in the row
# kernels went unseen until the browser build. Files that opt into AVX3_DL (the weight kernels)
# keep it, so the VNNI paths are sanitised.
function(kvq_hwy_policy target)
  if(KVQ_SANITIZE)
    target_compile_definitions(${target} PUBLIC "HWY_DISABLED_TARGETS=(HWY_SSSE3|HWY_AVX3)")
  else()
    target_compile_definitions(${target} PUBLIC "HWY_DISABLED_TARGETS=(HWY_SSSE3|HWY_SSE4)")
  endif()
endfunction()
