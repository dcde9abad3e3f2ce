# SPDX-License-Identifier: Apache-2.0
# Installs the headers, the exported targets and the package config files.
include(CMakePackageConfigHelpers)

set(RATELIMIT_CMAKE_DIR "${CMAKE_INSTALL_DATADIR}/cmake/ratelimit")

install(TARGETS ratelimit EXPORT ratelimit-targets FILE_SET HEADERS)
install(EXPORT ratelimit-targets NAMESPACE ratelimit:: DESTINATION "${RATELIMIT_CMAKE_DIR}")

if(TARGET ratelimit_redis)
  install(TARGETS ratelimit_redis EXPORT ratelimit-redis-targets FILE_SET HEADERS)
  install(EXPORT ratelimit-redis-targets NAMESPACE ratelimit:: DESTINATION "${RATELIMIT_CMAKE_DIR}")
  install(FILES "${CMAKE_CURRENT_LIST_DIR}/Findhiredis.cmake" DESTINATION "${RATELIMIT_CMAKE_DIR}")
endif()

configure_package_config_file(
  "${CMAKE_CURRENT_LIST_DIR}/ratelimitConfig.cmake.in"
  "${CMAKE_CURRENT_BINARY_DIR}/ratelimitConfig.cmake"
  INSTALL_DESTINATION "${RATELIMIT_CMAKE_DIR}")
write_basic_package_version_file(
  "${CMAKE_CURRENT_BINARY_DIR}/ratelimitConfigVersion.cmake"
  COMPATIBILITY SameMajorVersion ARCH_INDEPENDENT)
install(FILES "${CMAKE_CURRENT_BINARY_DIR}/ratelimitConfig.cmake"
              "${CMAKE_CURRENT_BINARY_DIR}/ratelimitConfigVersion.cmake"
        DESTINATION "${RATELIMIT_CMAKE_DIR}")
