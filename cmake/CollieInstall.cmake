# cmake --install: the executable and its libraries (libcollie_app, libcollie_torch),
# libcollie_core, the public headers, the shipped plugins and
# a CMake package so that out-of-tree plugins can find_package(collie).
include(CMakePackageConfigHelpers)

install(TARGETS collie collie_core EXPORT collieTargets
  RUNTIME DESTINATION "${CMAKE_INSTALL_BINDIR}"
  LIBRARY DESTINATION "${CMAKE_INSTALL_LIBDIR}"
  INCLUDES DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}")
install(TARGETS collie_app collie_torch_runtime LIBRARY DESTINATION "${CMAKE_INSTALL_LIBDIR}")
install(DIRECTORY framework/include/collie DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}"
  FILES_MATCHING PATTERN "*.h" PATTERN "*.in" EXCLUDE)
install(FILES "${CMAKE_BINARY_DIR}/generated/collie/config.h"
  DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}/collie")

set(COLLIE_CMAKE_DIR "${CMAKE_INSTALL_LIBDIR}/cmake/collie")
install(EXPORT collieTargets NAMESPACE collie:: DESTINATION "${COLLIE_CMAKE_DIR}")
configure_package_config_file(cmake/collieConfig.cmake.in
  "${CMAKE_BINARY_DIR}/collieConfig.cmake"
  INSTALL_DESTINATION "${COLLIE_CMAKE_DIR}"
  PATH_VARS COLLIE_INSTALL_PLUGIN_DIR)
write_basic_package_version_file("${CMAKE_BINARY_DIR}/collieConfigVersion.cmake"
  COMPATIBILITY SameMinorVersion)
install(FILES "${CMAKE_BINARY_DIR}/collieConfig.cmake"
  "${CMAKE_BINARY_DIR}/collieConfigVersion.cmake"
  cmake/CollieAddPlugin.cmake
  DESTINATION "${COLLIE_CMAKE_DIR}")
