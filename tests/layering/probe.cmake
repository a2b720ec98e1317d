# A layer's refused-include probes (CMakeLists.txt beside this): builds TARGET, whose sources each
# include one header the layer must not see, going on past failures (KEEP_GOING), and passes only
# if every source failed because the compiler could not find its header (in g++'s or clang's
# words) and for no other reason. HEADERS: the headers, separated by |.
string(REPLACE "|" ";" headers "${HEADERS}")
separate_arguments(keep_going UNIX_COMMAND "${KEEP_GOING}")
execute_process(COMMAND "${CMAKE_COMMAND}" --build "${BUILD_DIR}" --target "${TARGET}" -- ${keep_going}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(rc EQUAL 0)
  message(FATAL_ERROR "${TARGET} built: its includes were not refused\n${out}")
endif()
set(missing "")
foreach(h ${headers})
  string(REPLACE "." "\\." h_re "${h}")
  if(NOT out MATCHES "${h_re}(: No such file or directory|' file not found)")
    list(APPEND missing "${h}")
  endif()
endforeach()
# Each source stops at its one include: as many compiler errors as headers, all of them the above.
string(REGEX MATCHALL "error: [^\n]*" errors "${out}")
list(LENGTH errors n_errors)
list(LENGTH headers n_headers)
if(missing OR NOT n_errors EQUAL n_headers)
  message(FATAL_ERROR "${TARGET}: expected ${n_headers} 'not found' errors, got ${n_errors}; "
                      "not refused as expected: ${missing}\n${out}")
endif()
message(STATUS "${TARGET}: all ${n_headers} includes refused")
