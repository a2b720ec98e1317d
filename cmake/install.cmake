# `cmake --install BUILD [--prefix P]`: the public headers (include/kvq.h, include/kvq/*.h), the
# static libraries of the layers below the API, and the package files (lib/cmake/kvq/) that let
# `find_package(kvq)` give `target_link_libraries(app PRIVATE kvq::kvq)`. tests/consumer/ builds
# a C++ and a C program against such an install.
include(CMakePackageConfigHelpers)

install(TARGETS ${kvq_api_layers} kvq_package EXPORT kvqTargets
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

# libkvq.so (cmake/shared_library.cmake), as the CMake target kvq::shared and for pkg-config
# (`pkg-config --cflags --libs kvq`). The .pc file finds the prefix from its own place
# (${pcfiledir}), so an install moved or made with --prefix still points at itself.
if(TARGET kvq_shared)
  install(TARGETS kvq_shared EXPORT kvqTargets LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
  file(RELATIVE_PATH kvq_pc_to_prefix "/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/")
  string(REGEX REPLACE "/$" "" kvq_pc_to_prefix "${kvq_pc_to_prefix}")  # "../..", not "../../"
  configure_file(cmake/kvq.pc.in ${PROJECT_BINARY_DIR}/kvq.pc @ONLY)
  install(FILES ${PROJECT_BINARY_DIR}/kvq.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
endif()
