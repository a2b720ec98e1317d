# -DKVQ_SANITIZE=ON: AddressSanitizer + UndefinedBehaviorSanitizer for everything kvq builds.
# UBSan is made fatal so a report fails the test that triggered it.
if(KVQ_SANITIZE)
  add_compile_options(-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer)
  add_link_options(-fsanitize=address,undefined -fno-sanitize-recover=all)
endif()
