# KVQ_BUILD_WEB (native builds; default = KVQ_BUILD_TESTS, since the browser test needs it): builds
# the web bundle with the native build by running the Emscripten build (CMakePresets.json's "wasm")
# in ${CMAKE_BINARY_DIR}/wasm. Gives KVQ_WEB_BUNDLE_DIR (the bundle) and the target kvq_web_bundle,
# which tests that load the bundle depend on.
option(KVQ_BUILD_WEB "Build the web bundle (Emscripten) with the native build" ${KVQ_BUILD_TESTS})
if(NOT KVQ_BUILD_WEB)
  return()
endif()

find_program(KVQ_EMCC emcc)
if(NOT KVQ_EMCC)
  message(FATAL_ERROR "KVQ_BUILD_WEB (on with the tests) needs Emscripten's emcc, which is not on PATH: "
                      "run scripts/setup.sh, or configure with -DKVQ_BUILD_WEB=OFF")
endif()
# The toolchain file sits beside emcc's real location (Debian: /usr/share/emscripten).
get_filename_component(kvq_emcc_dir "${KVQ_EMCC}" REALPATH)
get_filename_component(kvq_emcc_dir "${kvq_emcc_dir}" DIRECTORY)
set(KVQ_EMSCRIPTEN_TOOLCHAIN "${kvq_emcc_dir}/cmake/Modules/Platform/Emscripten.cmake"
    CACHE FILEPATH "Emscripten's CMake toolchain file")
if(NOT EXISTS "${KVQ_EMSCRIPTEN_TOOLCHAIN}")
  message(FATAL_ERROR "Emscripten's toolchain file ${KVQ_EMSCRIPTEN_TOOLCHAIN} is missing: run scripts/setup.sh "
                      "or set KVQ_EMSCRIPTEN_TOOLCHAIN")
endif()

set(KVQ_WEB_BUILD_DIR "${CMAKE_BINARY_DIR}/wasm")
set(KVQ_WEB_BUNDLE_DIR "${KVQ_WEB_BUILD_DIR}/web")
# Configured once; afterwards its own build re-runs CMake when a CMakeLists.txt changes.
add_custom_command(
  OUTPUT "${KVQ_WEB_BUILD_DIR}/CMakeCache.txt"
  COMMAND "${CMAKE_COMMAND}" -S "${PROJECT_SOURCE_DIR}" -B "${KVQ_WEB_BUILD_DIR}" -G Ninja
          "-DCMAKE_TOOLCHAIN_FILE=${KVQ_EMSCRIPTEN_TOOLCHAIN}" -DCMAKE_BUILD_TYPE=Release
  COMMENT "Configuring the Emscripten build in ${KVQ_WEB_BUILD_DIR}"
  VERBATIM)
# Always run: the inner build decides what is out of date (and ends with tools/check_bundle.mjs).
add_custom_target(kvq_web_bundle ALL
  COMMAND "${CMAKE_COMMAND}" --build "${KVQ_WEB_BUILD_DIR}"
  DEPENDS "${KVQ_WEB_BUILD_DIR}/CMakeCache.txt"
  COMMENT "Building the web bundle (${KVQ_WEB_BUNDLE_DIR})"
  USES_TERMINAL VERBATIM)
