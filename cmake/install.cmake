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

if(TARGET ratelimit_asio)
  install(TARGETS ratelimit_asio EXPORT ratelimit-asio-targets FILE_SET HEADERS)
  install(EXPORT ratelimit-asio-targets NAMESPACE ratelimit:: DESTINATION "${RATELIMIT_CMAKE_DIR}")
endif()

configure_package_config_file(
  "${CMAKE_CURRENT_LIST_DIR}/ratelimitConfig.cmake.in"
  "${CMAKE_CURRENT_BINARY_DIR}/ratelimitConfig.cmake"
  INSTALL_DESTINATION "${RATELIMIT_CMAKE_DIR}")
# Before 1.0 a minor release may break the API (semantic versioning), so a
# 0.x install satisfies requests for its own minor series only: 0.1.0 answers
# find_package(ratelimit 0.1) but neither 0.0 nor 1.
if(PROJECT_VERSION_MAJOR EQUAL 0)
  set(_ratelimit_compatibility SameMinorVersion)
else()
  set(_ratelimit_compatibility SameMajorVersion)
endif()
write_basic_package_version_file(
  "${CMAKE_CURRENT_BINARY_DIR}/ratelimitConfigVersion.cmake"
  COMPATIBILITY ${_ratelimit_compatibility} ARCH_INDEPENDENT)
install(FILES "${CMAKE_CURRENT_BINARY_DIR}/ratelimitConfig.cmake"
              "${CMAKE_CURRENT_BINARY_DIR}/ratelimitConfigVersion.cmake"
        DESTINATION "${RATELIMIT_CMAKE_DIR}")
