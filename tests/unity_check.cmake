# SPDX-License-Identifier: Apache-2.0
# Checks the test filters of a binary made by ratelimit_add_unity_tests
# (tests/CMakeLists.txt), run as a CTest test of its own:
#   cmake -D BINARY=<test binary> -D FILTERS=<binary>_filters.cmake -P unity_check.cmake
# FILTERS sets UNITY_STEMS (the files) and UNITY_FILTER_<stem> (each file's
# --gtest_filter). Fails when a file's filter selects no test (GoogleTest
# 1.12 runs zero tests and exits 0, so that file's tests would silently stop
# running), when a test of the binary is selected by no file's filter (a
# suite the configure-time scan missed), or when a test is selected by more
# than one (it would run twice, in two CTest tests).
cmake_policy(SET CMP0057 NEW)  # if(IN_LIST)
include("${FILTERS}")

function(list_tests filter out)
  execute_process(COMMAND "${BINARY}" --gtest_list_tests "--gtest_filter=${filter}"
                  RESULT_VARIABLE rc OUTPUT_VARIABLE text ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${BINARY} --gtest_list_tests failed (${rc}): ${err}")
  endif()
  # --gtest_list_tests prints "Suite." lines and "  Test" lines under them.
  string(REPLACE "\n" ";" lines "${text}")
  set(names "")
  set(suite "")
  foreach(line IN LISTS lines)
    if(line MATCHES "^([^ ]+\\.)( |$)")
      set(suite "${CMAKE_MATCH_1}")
    elseif(line MATCHES "^  ([^ ]+)")
      list(APPEND names "${suite}${CMAKE_MATCH_1}")
    endif()
  endforeach()
  set(${out} "${names}" PARENT_SCOPE)
endfunction()

set(problems "")
set(selected "")
set(all_filters "")
foreach(stem IN LISTS UNITY_STEMS)
  list_tests("${UNITY_FILTER_${stem}}" names)
  list(LENGTH names n)
  message(STATUS "${stem}: ${n} tests")
  if(n EQUAL 0)
    string(APPEND problems "${stem}: its filter selects no test: ${UNITY_FILTER_${stem}}\n")
  endif()
  foreach(name IN LISTS names)
    if(name IN_LIST selected)
      string(APPEND problems "${name}: selected by ${stem} and by an earlier file\n")
    endif()
  endforeach()
  list(APPEND selected ${names})
  string(APPEND all_filters "${UNITY_FILTER_${stem}}:")
endforeach()
list_tests("-${all_filters}" missed)
foreach(name IN LISTS missed)
  string(APPEND problems "${name}: selected by no file's filter\n")
endforeach()
if(problems)
  message(FATAL_ERROR "${BINARY}:\n${problems}")
endif()
