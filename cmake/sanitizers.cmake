# -DKVQ_SANITIZE=ON: AddressSanitizer + UndefinedBehaviorSanitizer. UBSan is made fatal so a report
# fails the test that triggered it.
#
# What is instrumented: every kvq library (kvq_layer adds KVQ_SANITIZE_FLAGS to each), which is all
# of kvq's code that reads files, holds caches and runs models. The test programs and the kvq
# program's flag wiring (src/cli/, CLI11's templates) are compiled without instrumentation and
# linked with the runtime: mixing is supported (ASan still intercepts every malloc and free, and
# checks every access the libraries make), and it halves their compile time (cmd_plan.cc: 24.5 s
# instrumented at -O1 -g1, 11.2 s not), which is what keeps CI's two passes under its time limit.
if(KVQ_SANITIZE)
  set(KVQ_SANITIZE_FLAGS -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer)
  add_link_options(-fsanitize=address,undefined -fno-sanitize-recover=all)
endif()
