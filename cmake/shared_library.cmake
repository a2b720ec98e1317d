# libkvq.so: the C API (include/kvq.h) as one shared library, for programs and FFIs (Python's
# ctypes, Rust, Go) that load kvq at run time. It holds the layers from kvq_base to kvq_api and
# exports the C API's functions only: the header marks them KVQ_API (default visibility), the
# target compiles hidden by default, and the version script hides every other symbol, C++ template
# instances from the static layers and libstdc++'s headers included (`nm -D --defined-only` lists
# kvq_* and nothing else; tests/api/c_api_ctypes_test.sh checks it).
#
# Static archives linked into a shared object must be position-independent, so the API layers are
# built with -fPIC (one build serves the static package, the CLI and this library).
set_target_properties(${kvq_api_layers} PROPERTIES POSITION_INDEPENDENT_CODE ON)

# The C API's files are compiled again here (they are also in kvq_api, for the static package): the
# copies in the library are the ones whose KVQ_API functions the version script exports; the
# archive's copies are never pulled in, since these define every symbol they would.
file(GLOB kvq_c_api_srcs CONFIGURE_DEPENDS "${PROJECT_SOURCE_DIR}/src/api/c_api*.cc")
add_library(kvq_shared SHARED ${kvq_c_api_srcs})
target_link_libraries(kvq_shared PRIVATE kvq_api)
target_include_directories(kvq_shared INTERFACE $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
set_target_properties(kvq_shared PROPERTIES
  OUTPUT_NAME kvq
  EXPORT_NAME shared
  LIBRARY_OUTPUT_DIRECTORY "${CMAKE_BINARY_DIR}"
  VERSION "${PROJECT_VERSION}"
  # 0.x: a minor version may change the ABI, so it is part of the soname (libkvq.so.0.1).
  SOVERSION "${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR}"
  C_VISIBILITY_PRESET hidden
  CXX_VISIBILITY_PRESET hidden
  VISIBILITY_INLINES_HIDDEN ON
  LINK_DEPENDS "${PROJECT_SOURCE_DIR}/cmake/libkvq.map")
# --no-undefined: every symbol the C API needs is in the library or a library it names.
target_link_options(kvq_shared PRIVATE "LINKER:--version-script=${PROJECT_SOURCE_DIR}/cmake/libkvq.map"
                    "LINKER:--no-undefined")
kvq_apply_warnings(kvq_shared)
