# Warnings for kvq's own targets (not for third-party headers).
function(kvq_apply_warnings target)
  # Designated initializers leave members at their defaults on purpose.
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wshadow -Wno-sign-compare
    -Wno-missing-field-initializers)
endfunction()
