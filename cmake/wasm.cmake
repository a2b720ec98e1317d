# The Emscripten build (CMakeLists.txt includes this when EMSCRIPTEN): the dependencies the native
# build gets from find_package, made here for wasm32 — Highway compiled from its Debian source
# and fmt compiled from their Debian sources (scripts/setup.sh fetches them into .deps/),
# nlohmann-json from Debian's headers (only its own folder exposed, not all of /usr/include) — and
# threads only in the pthreads variant.
option(KVQ_WASM_SIMD "WebAssembly SIMD128 (kvq.js); OFF: Highway's scalar fallback (kvq-scalar.js)" ON)
option(KVQ_WASM_THREADS "Emscripten pthreads over a SharedArrayBuffer (kvq-threads.js, SIMD128 only)" OFF)
option(KVQ_WASM_BUNDLE "Assemble the web bundle (this build's module, the scalar variant, page, models)" ON)

# kvq_deps_source(VAR NAME PREFIX MARKER): VAR (a cache path) = the newest .deps/PREFIX-* folder that
# scripts/setup.sh unpacked from a Debian source package; refused unless it holds MARKER.
function(kvq_deps_source var name prefix marker)
  file(GLOB dirs "${PROJECT_SOURCE_DIR}/.deps/${prefix}-*")
  list(SORT dirs)
  list(GET dirs -1 newest)  # empty list -> NOTFOUND
  set(${var} "${newest}" CACHE PATH "${name}'s source tree (scripts/setup.sh fetches it)")
  if(NOT EXISTS "${${var}}/${marker}")
    message(FATAL_ERROR "${name}'s source is missing (looked for .deps/${prefix}-*/${marker}, ${var}='${${var}}'): "
                        "run scripts/setup.sh, which fetches it with apt-get source")
  endif()
endfunction()

kvq_deps_source(KVQ_HWY_SOURCE_DIR Highway highway hwy/targets.cc)

if(KVQ_WASM_SIMD)
  add_compile_options(-msimd128)
endif()
if(KVQ_WASM_THREADS)
  if(NOT KVQ_WASM_SIMD)
    message(FATAL_ERROR "KVQ_WASM_THREADS: the threaded variant is built with SIMD128 only (KVQ_WASM_SIMD=ON)")
  endif()
  # Every object: atomics and shared memory are a property of the whole module.
  add_compile_options(-pthread)
  add_link_options(-pthread)
endif()
# One Highway target per variant (WASM with -msimd128, else EMU128): a wasm module cannot hold code
# its engine does not validate, so the variants are separate modules and runtime dispatch inside
# one has nothing to choose from; compiling EMU128 into the SIMD module too doubled its build time.
add_compile_definitions(HWY_COMPILE_ONLY_STATIC=1)
add_compile_options("SHELL:-include ${PROJECT_SOURCE_DIR}/cmake/wasm_compat.h")

# Highway: the runtime part (target selection, printing, aligned allocation) as a static library.
add_library(kvq_hwy STATIC
  "${KVQ_HWY_SOURCE_DIR}/hwy/aligned_allocator.cc" "${KVQ_HWY_SOURCE_DIR}/hwy/per_target.cc"
  "${KVQ_HWY_SOURCE_DIR}/hwy/print.cc" "${KVQ_HWY_SOURCE_DIR}/hwy/targets.cc")
target_include_directories(kvq_hwy SYSTEM PUBLIC "${KVQ_HWY_SOURCE_DIR}")
target_compile_definitions(kvq_hwy PUBLIC HWY_STATIC_DEFINE)
add_library(hwy::hwy ALIAS kvq_hwy)
add_library(kvq_hwy_contrib INTERFACE)  # kvq uses only header-only contrib parts (math-inl.h)
target_link_libraries(kvq_hwy_contrib INTERFACE kvq_hwy)
add_library(hwy::hwy_contrib ALIAS kvq_hwy_contrib)

# kvq_wasm_header_dir(TARGET HEADER_DIR...): an include root holding links to just these folders.
function(kvq_wasm_header_target target)
  set(root "${PROJECT_BINARY_DIR}/wasm_include/${target}")
  file(MAKE_DIRECTORY "${root}")
  foreach(dir ${ARGN})
    if(NOT IS_DIRECTORY "${dir}")
      message(FATAL_ERROR "${dir} is missing: run scripts/setup.sh (Debian's headers are used for wasm too)")
    endif()
    get_filename_component(name "${dir}" NAME)
    file(CREATE_LINK "${dir}" "${root}/${name}" SYMBOLIC)
  endforeach()
  add_library(${target} INTERFACE)
  target_include_directories(${target} SYSTEM INTERFACE "${root}")
endfunction()

# fmt: its one implementation file compiled once, not FMT_HEADER_ONLY in every object (which
# doubled each WebAssembly object's compile time: kv_cache.cc 6.7 s -> 3.5 s at -O3).
kvq_deps_source(KVQ_FMT_SOURCE_DIR fmt fmt src/format.cc)
add_library(kvq_fmt STATIC "${KVQ_FMT_SOURCE_DIR}/src/format.cc")
target_include_directories(kvq_fmt SYSTEM PUBLIC "${KVQ_FMT_SOURCE_DIR}/include")
add_library(fmt::fmt ALIAS kvq_fmt)

set(KVQ_WASM_HEADERS /usr/include CACHE PATH "Where Debian's nlohmann headers are")
kvq_wasm_header_target(kvq_json_headers "${KVQ_WASM_HEADERS}/nlohmann")
add_library(nlohmann_json::nlohmann_json ALIAS kvq_json_headers)
# Without pthreads every thread pool runs with one thread (the caller's), which spawns nothing; the
# pthreads variant's -pthread is on every object and link above.
add_library(kvq_wasm_threads INTERFACE)
add_library(Threads::Threads ALIAS kvq_wasm_threads)
