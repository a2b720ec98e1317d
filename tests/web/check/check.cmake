# The web bundle's self-check (tools/check_bundle.mjs): fixture bundles for each kind of miss, and the built
# bundle (KVQ_WEB_BUNDLE_DIR, assembled by the wasm build) with each reached file removed in turn. The real-bundle
# test fails, it does not skip, when the bundle is not there; it depends on no other test.
find_program(KVQ_NODE node REQUIRED)
set(kvq_check_bundle "${PROJECT_SOURCE_DIR}/tools/check_bundle.mjs")
add_test(NAME web.check_bundle_fixtures
         COMMAND "${KVQ_NODE}" "${CMAKE_CURRENT_LIST_DIR}/fixtures_test.mjs" "${kvq_check_bundle}")
set_tests_properties(web.check_bundle_fixtures PROPERTIES TIMEOUT 300)
if(KVQ_BUILD_WEB)  # the bundle (KVQ_WEB_BUNDLE_DIR) is built by cmake/web_bundle.cmake
  add_test(NAME web.check_bundle_real
           COMMAND "${KVQ_NODE}" "${CMAKE_CURRENT_LIST_DIR}/real_bundle_test.mjs" "${KVQ_WEB_BUNDLE_DIR}"
                   "${kvq_check_bundle}")
  set_tests_properties(web.check_bundle_real PROPERTIES TIMEOUT 300)
endif()
