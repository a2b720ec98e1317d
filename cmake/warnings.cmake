# Warnings for kvq's own targets (not for third-party headers).
function(kvq_apply_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wshadow -Wno-sign-compare)
endfunction()
