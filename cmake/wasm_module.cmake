# The WebAssembly module (kvq.js + kvq.wasm, kvq-threads.* with pthreads, or kvq-scalar.*) and, in
# the SIMD build, the web bundle: BUNDLE = ${CMAKE_BINARY_DIR}/web with the page (web/), the three
# modules and the bundled model, checked by tools/check_bundle.mjs as the last step. Included by
# CMakeLists.txt after the layers.
if(KVQ_WASM_THREADS)
  set(kvq_module_name kvq-threads)
elseif(KVQ_WASM_SIMD)
  set(kvq_module_name kvq)
else()
  set(kvq_module_name kvq-scalar)
endif()
set(kvq_module_dir "${PROJECT_BINARY_DIR}/module")

# The functions src/web/*.cc export (docs/architecture.md, "The WebAssembly module's boundary"), and what JS calls them with.
set(kvq_web_exports
  kvq_web_model_load kvq_web_model_info kvq_web_model_free kvq_web_session_new kvq_web_session_free
  kvq_web_tokenize kvq_web_detokenize kvq_web_prefill kvq_web_decode
  kvq_web_set_sampler kvq_web_sample kvq_web_session_stats kvq_web_formats kvq_web_simd_target
  kvq_web_last_error kvq_web_kv_new kvq_web_kv_free kvq_web_kv_plan kvq_web_kv_append
  kvq_web_kv_attend_device kvq_web_kv_rows kvq_web_kv_new_for_model kvq_web_gpu_program kvq_web_gpu_rope
  kvq_web_kv_positions kvq_web_kv_rewind kvq_web_kv_cpu_step kvq_web_apply_template kvq_web_tokenize_chat_prompt
  kvq_web_session_keep_prefix kvq_web_positions_to_keep
  kvq_web_max_threads kvq_web_memory_scratch_bytes kvq_web_file_alloc kvq_web_file_free kvq_web_model_load_bytes
  kvq_web_gguf_header_bytes kvq_web_model_load_header
  kvq_web_session_set_threads
  kvq_web_generator_check kvq_web_generator_new kvq_web_generator_new_for_sequence kvq_web_generator_next
  kvq_web_generator_cancel kvq_web_generator_free kvq_web_prefill_block
  kvq_web_sampler_new kvq_web_sampler_free kvq_web_sampler_next_words kvq_web_sampler_sample
  kvq_web_sampler_edits_capacity kvq_web_sampler_edits kvq_web_sampler_adjust
  kvq_web_sample_with_words kvq_web_sample_exp2_table
  kvq_web_moe_route kvq_web_moe_ffn kvq_web_gpu_moe_program
  malloc free)
list(TRANSFORM kvq_web_exports PREPEND "'_")
list(TRANSFORM kvq_web_exports APPEND "'")
list(JOIN kvq_web_exports "," kvq_web_exports)

file(GLOB kvq_web_srcs CONFIGURE_DEPENDS "${PROJECT_SOURCE_DIR}/src/web/*.cc")
add_executable(kvq_web ${kvq_web_srcs})
set_target_properties(kvq_web PROPERTIES OUTPUT_NAME ${kvq_module_name} SUFFIX ".js"
                                         RUNTIME_OUTPUT_DIRECTORY "${kvq_module_dir}")
target_link_libraries(kvq_web PRIVATE kvq_api kvq_formats kvq_simd nlohmann_json::nlohmann_json)
kvq_include_root(kvq_web web PRIVATE web_root)
kvq_apply_warnings(kvq_web)
# 2 GB at most: handles and buffers cross to JS as signed 32-bit ints (docs/architecture.md), so every
# address must stay below 2^31. The model is held once (web_load.cc): what the heap holds beyond
# the file and the KV is bounded by the initial memory plus one growth step past a request (the
# 20% geometric step, capped here at 16 MiB, not Emscripten's 96 MiB: 20% of a 400 MiB heap would
# be 80 MiB of nothing). Their sum is the scratch the page states (kvq_web_memory_scratch_bytes).
set(kvq_wasm_initial_memory 33554432)
set(kvq_wasm_growth_cap 16777216)
target_compile_definitions(kvq_web PRIVATE KVQ_WASM_INITIAL_MEMORY=${kvq_wasm_initial_memory}
                                           KVQ_WASM_GROWTH_CAP=${kvq_wasm_growth_cap})
target_link_options(kvq_web PRIVATE
  -sMODULARIZE=1 -sEXPORT_NAME=createKvq -sENVIRONMENT=web,worker
  -sALLOW_MEMORY_GROWTH=1 -sINITIAL_MEMORY=${kvq_wasm_initial_memory} -sMAXIMUM_MEMORY=2147483648
  -sMEMORY_GROWTH_GEOMETRIC_CAP=${kvq_wasm_growth_cap}
  -sFORCE_FILESYSTEM=1
  # The chat template's interpreter catches its own exceptions (jinja/chat_template.cc): catching on.
  -fexceptions
  "-sEXPORTED_FUNCTIONS=[${kvq_web_exports}]"
  "-sEXPORTED_RUNTIME_METHODS=['FS','ccall','cwrap','UTF8ToString','stringToUTF8','lengthBytesUTF8','HEAPU8','HEAP32','HEAPF32']")
if(KVQ_WASM_THREADS)
  # The pool of Web Workers that pthreads run on, started (and waited for) before createKvq resolves,
  # sized by the page (worker.js's kvqPoolSize: kvq's pool threads and a KV staging thread): a
  # thread started when the pool is empty would wait for the event loop that the blocked caller holds.
  # Growth of a shared memory is allowed; the page's JS re-reads the buffer after it (worker.js).
  target_link_options(kvq_web PRIVATE "-sPTHREAD_POOL_SIZE=Module.kvqPoolSize" -sPTHREAD_POOL_SIZE_STRICT=2
                                      -Wno-pthreads-mem-growth)
endif()
# emcc's JS optimiser needs Debian's acorn, which the node on PATH may not search.
set_property(TARGET kvq_web PROPERTY RULE_LAUNCH_LINK "${CMAKE_COMMAND} -E env NODE_PATH=/usr/share/nodejs")

if(NOT KVQ_WASM_SIMD OR NOT KVQ_WASM_BUNDLE)
  return()
endif()

# The module's weight kernels timed in Node, rows against 16-row groups (bench/wasm_matvec_bench.cc):
# `node build/wasm/kvq-matvec-bench.js`. Built with the module so it compiles wherever it does.
add_executable(kvq_wasm_matvec_bench "${PROJECT_SOURCE_DIR}/bench/wasm_matvec_bench.cc")
set_target_properties(kvq_wasm_matvec_bench PROPERTIES OUTPUT_NAME kvq-matvec-bench SUFFIX ".js"
                                                       RUNTIME_OUTPUT_DIRECTORY "${PROJECT_BINARY_DIR}")
target_link_libraries(kvq_wasm_matvec_bench PRIVATE kvq_weights kvq_base)
kvq_apply_warnings(kvq_wasm_matvec_bench)
# Node, synchronous compilation (this Emscripten's asynchronous path fetches the .wasm by a URL,
# which Node's fetch refuses for a file path).
target_link_options(kvq_wasm_matvec_bench PRIVATE -sENVIRONMENT=node -sWASM_ASYNC_COMPILATION=0 -sEXIT_RUNTIME=1
                                                  -sALLOW_MEMORY_GROWTH=1 -sMAXIMUM_MEMORY=2147483648)
set_property(TARGET kvq_wasm_matvec_bench PROPERTY RULE_LAUNCH_LINK "${CMAKE_COMMAND} -E env NODE_PATH=/usr/share/nodejs")

# kvq_wasm_variant(TARGET DIR OPTIONS...): the same sources configured again in DIR with these
# options (each variant's objects differ throughout) and its kvq_web built there.
function(kvq_wasm_variant target dir)
  add_custom_target(${target}
    COMMAND "${CMAKE_COMMAND}" -S "${PROJECT_SOURCE_DIR}" -B "${dir}" -G "${CMAKE_GENERATOR}"
            "-DCMAKE_TOOLCHAIN_FILE=${CMAKE_TOOLCHAIN_FILE}" "-DCMAKE_BUILD_TYPE=${CMAKE_BUILD_TYPE}"
            ${ARGN} -DKVQ_WASM_BUNDLE=OFF "-DKVQ_HWY_SOURCE_DIR=${KVQ_HWY_SOURCE_DIR}"
            "-DKVQ_FMT_SOURCE_DIR=${KVQ_FMT_SOURCE_DIR}" "-DKVQ_WASM_HEADERS=${KVQ_WASM_HEADERS}"
            "-DCMAKE_CXX_COMPILER_LAUNCHER=${CMAKE_CXX_COMPILER_LAUNCHER}" --log-level=WARNING
    COMMAND "${CMAKE_COMMAND}" --build "${dir}" --target kvq_web
    COMMENT "Building the WebAssembly variant in ${dir}"
    USES_TERMINAL VERBATIM)
endfunction()

# The scalar variant (no -msimd128) and the pthreads one, built one after another after the SIMD
# module so that the builds do not share the cores.
set(kvq_scalar_dir "${PROJECT_BINARY_DIR}/scalar")
kvq_wasm_variant(kvq_web_scalar "${kvq_scalar_dir}" -DKVQ_WASM_SIMD=OFF)
add_dependencies(kvq_web_scalar kvq_web)
set(kvq_threads_dir "${PROJECT_BINARY_DIR}/threads")
kvq_wasm_variant(kvq_web_threads "${kvq_threads_dir}" -DKVQ_WASM_THREADS=ON)
add_dependencies(kvq_web_threads kvq_web_scalar)

set(KVQ_WEB_BUNDLE_DIR "${PROJECT_BINARY_DIR}/web")
add_custom_target(kvq_web_bundle ALL
  COMMAND "${CMAKE_COMMAND}" "-DBUNDLE=${KVQ_WEB_BUNDLE_DIR}" "-DSOURCE=${PROJECT_SOURCE_DIR}"
          "-DMODULES=${kvq_module_dir}/kvq.js;${kvq_module_dir}/kvq.wasm;${kvq_scalar_dir}/module/kvq-scalar.js;${kvq_scalar_dir}/module/kvq-scalar.wasm;${kvq_threads_dir}/module/kvq-threads.js;${kvq_threads_dir}/module/kvq-threads.wasm;${kvq_threads_dir}/module/kvq-threads.worker.js"
          -P "${PROJECT_SOURCE_DIR}/cmake/assemble_bundle.cmake"
  COMMENT "Assembling the web bundle in ${KVQ_WEB_BUNDLE_DIR}"
  VERBATIM)
add_dependencies(kvq_web_bundle kvq_web kvq_web_scalar kvq_web_threads)
