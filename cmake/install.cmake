# `cmake --install BUILD [--prefix P]`: the public headers (include/kvq.h, include/kvq/*.h), the
# static libraries of the layers below the API, and the package files (lib/cmake/kvq/) that let
# `find_package(kvq)` give `target_link_libraries(app PRIVATE kvq::kvq)`. tests/consumer/ builds
# a C++ and a C program against such an install.
include(CMakePackageConfigHelpers)

set(kvq_installed_layers kvq_base kvq_simd kvq_formats kvq_attention kvq_cache kvq_gguf kvq_text
    kvq_weights kvq_model kvq_generate kvq_grammar kvq_api)
install(TARGETS ${kvq_installed_layers} kvq_package EXPORT kvqTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(FILES include/kvq.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY include/kvq DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} FILES_MATCHING PATTERN "*.h")
install(EXPORT kvqTargets NAMESPACE kvq:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/kvq)
configure_package_config_file(cmake/kvqConfig.cmake.in ${PROJECT_BINARY_DIR}/kvqConfig.cmake
                              INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/kvq)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/kvqConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/kvqConfig.cmake ${PROJECT_BINARY_DIR}/kvqConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/kvq)
