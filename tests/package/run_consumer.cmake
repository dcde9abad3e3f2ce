# SPDX-License-Identifier: Apache-2.0
# Script (cmake -P) that installs ratelimit into a scratch prefix, builds a consumer and checks its output.
#
# Inputs: RATELIMIT_SOURCE_DIR, CONSUMERS_DIR, WORK_DIR, MODE (find_package |
# find_package_redis | find_package_asio | add_subdirectory), CXX_COMPILER, GENERATOR. Everything it
# writes stays in WORK_DIR.
cmake_minimum_required(VERSION 3.23)

foreach(var RATELIMIT_SOURCE_DIR CONSUMERS_DIR WORK_DIR MODE CXX_COMPILER GENERATOR)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "run_consumer.cmake: ${var} is not set")
  endif()
endforeach()

# Runs a command, echoing it, and stops the test if it fails.
function(run_step what)
  message(STATUS "${what}: ${ARGN}")
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${rc})\n--- stdout ---\n${out}\n--- stderr ---\n${err}")
  endif()
endfunction()

file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
set(common -G "${GENERATOR}" -DCMAKE_CXX_COMPILER=${CXX_COMPILER} -DCMAKE_BUILD_TYPE=Release)

set(expected_file "${CONSUMERS_DIR}/expected_output.txt")
if(MODE MATCHES "^find_package(_redis|_asio)?$")
  set(prefix "${WORK_DIR}/prefix")
  set(with_redis OFF)
  if(MODE STREQUAL "find_package_redis")
    set(with_redis ON)
  endif()
  set(with_asio OFF)
  if(MODE STREQUAL "find_package_asio")
    set(with_asio ON)
  endif()
  run_step("configure ratelimit" ${CMAKE_COMMAND} -S "${RATELIMIT_SOURCE_DIR}"
           -B "${WORK_DIR}/ratelimit-build" ${common} "-DCMAKE_INSTALL_PREFIX=${prefix}"
           -DRATELIMIT_BUILD_TESTS=OFF -DRATELIMIT_BUILD_EXAMPLES=OFF
           -DRATELIMIT_BUILD_BENCHMARKS=OFF -DRATELIMIT_REDIS=${with_redis} -DRATELIMIT_ASIO=${with_asio})
  run_step("build ratelimit" ${CMAKE_COMMAND} --build "${WORK_DIR}/ratelimit-build")
  run_step("install ratelimit" ${CMAKE_COMMAND} --install "${WORK_DIR}/ratelimit-build")

  # The installed tree: the core headers and the package files, plus the Redis
  # store's headers, targets and hiredis finder only when it was built.
  set(core_files include/ratelimit/ratelimit.hpp include/ratelimit/limiter.hpp
      include/ratelimit/store/memory_store.hpp include/ratelimit/policy/gcra.hpp
      share/cmake/ratelimit/ratelimitConfig.cmake
      share/cmake/ratelimit/ratelimitConfigVersion.cmake
      share/cmake/ratelimit/ratelimit-targets.cmake)
  set(redis_files include/ratelimit/redis.hpp include/ratelimit/redis/redis_store.hpp
      include/ratelimit/redis/options.hpp include/ratelimit/redis/cluster_store.hpp
      share/cmake/ratelimit/ratelimit-redis-targets.cmake
      share/cmake/ratelimit/Findhiredis.cmake)
  set(asio_files include/ratelimit/asio.hpp share/cmake/ratelimit/ratelimit-asio-targets.cmake)
  set(must_exist ${core_files})
  set(must_not_exist)
  if(with_asio)
    list(APPEND must_exist ${asio_files})
    list(APPEND must_not_exist ${redis_files})
    set(consumer "${CONSUMERS_DIR}/find_package_asio_consumer")
    set(expected_file "${CONSUMERS_DIR}/expected_output_asio.txt")
  elseif(with_redis)
    list(APPEND must_exist ${redis_files})
    set(consumer "${CONSUMERS_DIR}/find_package_redis_consumer")
    set(expected_file "${CONSUMERS_DIR}/expected_output_redis.txt")
  else()
    set(must_not_exist ${redis_files} include/ratelimit/redis ${asio_files})
    set(consumer "${CONSUMERS_DIR}/find_package_consumer")
  endif()
  foreach(f IN LISTS must_exist)
    if(NOT EXISTS "${prefix}/${f}")
      message(FATAL_ERROR "install is missing ${f}")
    endif()
  endforeach()
  foreach(f IN LISTS must_not_exist)
    if(EXISTS "${prefix}/${f}")
      message(FATAL_ERROR "an install without that component must not contain ${f}")
    endif()
  endforeach()

  # The build tree is removed so the consumer can only use the installed files.
  file(REMOVE_RECURSE "${WORK_DIR}/ratelimit-build")
  run_step("configure consumer" ${CMAKE_COMMAND} -S "${consumer}"
           -B "${WORK_DIR}/consumer-build" ${common} "-DCMAKE_PREFIX_PATH=${prefix}")
elseif(MODE STREQUAL "add_subdirectory")
  run_step("configure consumer" ${CMAKE_COMMAND} -S "${CONSUMERS_DIR}/subdirectory_consumer"
           -B "${WORK_DIR}/consumer-build" ${common}
           "-DRATELIMIT_SOURCE_DIR=${RATELIMIT_SOURCE_DIR}")
else()
  message(FATAL_ERROR "unknown MODE '${MODE}'")
endif()

run_step("build consumer" ${CMAKE_COMMAND} --build "${WORK_DIR}/consumer-build")

set(app "${WORK_DIR}/consumer-build/app")
execute_process(COMMAND "${app}" RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "consumer exited with ${rc}\n${out}\n${err}")
endif()
file(READ "${expected_file}" expected)
if(NOT out STREQUAL expected)
  message(FATAL_ERROR "consumer output differs.\n--- expected ---\n${expected}--- got ---\n${out}")
endif()
message(STATUS "consumer (${MODE}) printed the expected decisions")
