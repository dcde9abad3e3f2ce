# SPDX-License-Identifier: Apache-2.0
# The optional Asio target ratelimit::asio: include/ratelimit/asio.hpp over
# standalone Asio (header-only; Debian libasio-dev, no Boost).
find_path(RATELIMIT_ASIO_INCLUDE_DIR asio.hpp DOC "Directory holding standalone Asio's asio.hpp")
if(NOT RATELIMIT_ASIO_INCLUDE_DIR)
  if(RATELIMIT_ASIO STREQUAL "ON")
    message(FATAL_ERROR "RATELIMIT_ASIO=ON but asio.hpp was not found (Debian: apt-get install libasio-dev)")
  endif()
  message(STATUS "ratelimit: standalone Asio not found; ratelimit::asio not built")
  return()
endif()
find_package(Threads REQUIRED)

add_library(ratelimit_asio INTERFACE)
add_library(ratelimit::asio ALIAS ratelimit_asio)
set_target_properties(ratelimit_asio PROPERTIES EXPORT_NAME asio)
target_compile_features(ratelimit_asio INTERFACE cxx_std_20)
# SYSTEM: Asio's own headers must not trip our -Werror.
target_include_directories(ratelimit_asio SYSTEM INTERFACE
                           "$<BUILD_INTERFACE:${RATELIMIT_ASIO_INCLUDE_DIR}>")
# Asio 1.22 (Debian 12) sees C++20 coroutines (co_await, use_awaitable) on g++
# only: on clang it looks for the old coroutines TS. Clang 14+ has them in C++20.
target_compile_definitions(ratelimit_asio INTERFACE ASIO_STANDALONE ASIO_NO_DEPRECATED
                           $<$<CXX_COMPILER_ID:Clang>:ASIO_HAS_CO_AWAIT=1>)
target_link_libraries(ratelimit_asio INTERFACE ratelimit::ratelimit Threads::Threads)
target_sources(ratelimit_asio INTERFACE
  FILE_SET HEADERS BASE_DIRS "${PROJECT_SOURCE_DIR}/include"
  FILES "${PROJECT_SOURCE_DIR}/include/ratelimit/asio.hpp")
