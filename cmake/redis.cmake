# SPDX-License-Identifier: Apache-2.0
# The optional Redis store: INTERFACE target ratelimit::redis (needs hiredis, and
# OpenSSL for rediss://).
set(_ratelimit_saved_module_path "${CMAKE_MODULE_PATH}")
list(PREPEND CMAKE_MODULE_PATH "${CMAKE_CURRENT_LIST_DIR}")
find_package(hiredis REQUIRED)
set(CMAKE_MODULE_PATH "${_ratelimit_saved_module_path}")
unset(_ratelimit_saved_module_path)
find_package(OpenSSL 1.1.1 REQUIRED)

add_library(ratelimit_redis INTERFACE)
add_library(ratelimit::redis ALIAS ratelimit_redis)
set_target_properties(ratelimit_redis PROPERTIES EXPORT_NAME redis)
target_compile_features(ratelimit_redis INTERFACE cxx_std_20)
target_link_libraries(ratelimit_redis INTERFACE ratelimit::ratelimit hiredis::hiredis
                      OpenSSL::SSL OpenSSL::Crypto)
file(GLOB_RECURSE RATELIMIT_REDIS_HEADERS CONFIGURE_DEPENDS
     "${PROJECT_SOURCE_DIR}/include/ratelimit/redis/*.hpp")
target_sources(ratelimit_redis INTERFACE
  FILE_SET HEADERS BASE_DIRS "${PROJECT_SOURCE_DIR}/include"
  FILES "${PROJECT_SOURCE_DIR}/include/ratelimit/redis.hpp" ${RATELIMIT_REDIS_HEADERS})
