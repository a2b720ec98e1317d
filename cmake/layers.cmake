# kvq_layer(NAME DIR DEPS targets... [PRIVATE_DEPS targets...] [PUBLIC_HEADERS paths under include/...]):
# one static library for src/DIR (subfolders included, so a format folder needs no CMake edit).
# PRIVATE_DEPS are linked for the layer's own sources only: a target linking the layer links them
# too but does not see their headers (a tool layer whose entry header is over include/ alone, as
# synth/ is, implemented with the layers below the API).
#
# Header visibility is part of the layering. Every target gets its own include root under the build
# tree holding only a link DIR -> src/DIR and links to its public headers in include/kvq/; the root
# is a PUBLIC include directory, so a target sees its own headers and those of the targets it links
# (transitively) and nothing else. An upward include ("model/decoder.h" from formats/) is then a
# "No such file" error at compile time, which tests/layering/ checks.
function(kvq_layer name dir)
  cmake_parse_arguments(PARSE_ARGV 2 arg "" "" "DEPS;PRIVATE_DEPS;PUBLIC_HEADERS")
  file(GLOB_RECURSE srcs CONFIGURE_DEPENDS "${PROJECT_SOURCE_DIR}/src/${dir}/*.cc")
  add_library(${name} STATIC ${srcs})
  kvq_include_root(${name} ${dir} PUBLIC root)
  foreach(h ${arg_PUBLIC_HEADERS})
    if(NOT EXISTS "${PROJECT_SOURCE_DIR}/include/${h}")
      message(FATAL_ERROR "kvq_layer(${name}): include/${h} does not exist")
    endif()
    file(CREATE_LINK "${PROJECT_SOURCE_DIR}/include/${h}" "${root}/${h}" SYMBOLIC)
  endforeach()
  target_include_directories(${name} PUBLIC $<BUILD_INTERFACE:${root}>)
  target_link_libraries(${name} PUBLIC ${arg_DEPS})
  if(arg_PRIVATE_DEPS)
    target_link_libraries(${name} PRIVATE ${arg_PRIVATE_DEPS})
  endif()
  set_property(GLOBAL APPEND PROPERTY KVQ_LAYERS ${name})
  # The layer's folder and public headers, for the layering probes (tests/layering/).
  set_target_properties(${name} PROPERTIES KVQ_LAYER_DIR "${dir}" KVQ_PUBLIC_HEADERS "${arg_PUBLIC_HEADERS}")
  kvq_apply_warnings(${name})
  if(KVQ_SANITIZE)
    target_compile_options(${name} PRIVATE ${KVQ_SANITIZE_FLAGS})  # cmake/sanitizers.cmake
  endif()
endfunction()

# kvq_include_root(TARGET DIR PUBLIC|PRIVATE OUT_VAR): the include root described above, holding
# a link DIR -> src/DIR, added to TARGET's include directories; OUT_VAR receives its path.
function(kvq_include_root target dir scope out_var)
  set(root "${PROJECT_BINARY_DIR}/include_roots/${target}")
  # Made afresh at every configure: a public header that moved to another layer must not stay
  # visible here through a link left by an earlier configure of this build tree.
  file(REMOVE_RECURSE "${root}")
  file(MAKE_DIRECTORY "${root}/kvq")
  file(CREATE_LINK "${PROJECT_SOURCE_DIR}/src/${dir}" "${root}/${dir}" SYMBOLIC)
  if(scope STREQUAL "PRIVATE")
    target_include_directories(${target} PRIVATE "${root}")
  endif()
  set(${out_var} "${root}" PARENT_SCOPE)
endfunction()
