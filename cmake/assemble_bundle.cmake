# cmake -DBUNDLE=dir -DSOURCE=repo -DMODULES="a.js;a.wasm;..." -P assemble_bundle.cmake: makes the web
# bundle afresh (so a file removed from web/ does not linger): the page (web/*), the modules, the
# bundled model; then checks it with tools/check_bundle.mjs, whose failure fails the build.
file(REMOVE_RECURSE "${BUNDLE}")
file(MAKE_DIRECTORY "${BUNDLE}/models")
if(IS_DIRECTORY "${SOURCE}/web")
  file(COPY "${SOURCE}/web/" DESTINATION "${BUNDLE}")
endif()
foreach(m ${MODULES})
  if(NOT EXISTS "${m}")
    message(FATAL_ERROR "web bundle: ${m} was not built")
  endif()
  file(COPY "${m}" DESTINATION "${BUNDLE}")
endforeach()
file(COPY "${SOURCE}/models/stories260K/stories260K.bin" "${SOURCE}/models/stories260K/tok512.bin"
     DESTINATION "${BUNDLE}/models")
# The self-check: every file the page loads is in the bundle and nothing points outside it.
find_program(NODE node REQUIRED)
execute_process(COMMAND "${NODE}" "${SOURCE}/tools/check_bundle.mjs" "${BUNDLE}" RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "web bundle: tools/check_bundle.mjs ${BUNDLE} failed (exit ${rc}): the bundle is incomplete")
endif()
