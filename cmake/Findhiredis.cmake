# SPDX-License-Identifier: Apache-2.0
# Finds hiredis and defines the imported target hiredis::hiredis.
#
# Order: an existing hiredis::hiredis target; hiredis's own CMake package
# (hiredis >= 1.0 installs hiredis-config.cmake); then pkg-config hints with
# find_path/find_library, so a plain `apt-get install libhiredis-dev` works.
# Sets hiredis_FOUND, hiredis_VERSION, hiredis_INCLUDE_DIR, hiredis_LIBRARY.
include(FindPackageHandleStandardArgs)

if(TARGET hiredis::hiredis)
  set(hiredis_FOUND TRUE)
  return()
endif()

find_package(hiredis CONFIG QUIET NO_CMAKE_PACKAGE_REGISTRY)
if(TARGET hiredis::hiredis)
  find_package_handle_standard_args(hiredis CONFIG_MODE)
  return()
endif()

find_package(PkgConfig QUIET)
if(PKG_CONFIG_FOUND)
  pkg_check_modules(PC_hiredis QUIET hiredis)
endif()

# The .pc file's includedir is .../include/hiredis; headers are included as
# <hiredis/hiredis.h>, so look for its parent too.
set(_hiredis_include_hints)
foreach(dir IN LISTS PC_hiredis_INCLUDE_DIRS PC_hiredis_INCLUDEDIR)
  get_filename_component(_parent "${dir}" DIRECTORY)
  list(APPEND _hiredis_include_hints "${dir}" "${_parent}")
endforeach()

find_path(hiredis_INCLUDE_DIR NAMES hiredis/hiredis.h HINTS ${_hiredis_include_hints})
find_library(hiredis_LIBRARY NAMES hiredis HINTS ${PC_hiredis_LIBDIR} ${PC_hiredis_LIBRARY_DIRS})

if(hiredis_INCLUDE_DIR AND EXISTS "${hiredis_INCLUDE_DIR}/hiredis/hiredis.h")
  file(STRINGS "${hiredis_INCLUDE_DIR}/hiredis/hiredis.h" _hiredis_version_lines
       REGEX "^#define HIREDIS_(MAJOR|MINOR|PATCH) [0-9]+")
  foreach(part MAJOR MINOR PATCH)
    string(REGEX MATCH "HIREDIS_${part} ([0-9]+)" _m "${_hiredis_version_lines}")
    set(_hiredis_${part} "${CMAKE_MATCH_1}")
  endforeach()
  if(NOT "${_hiredis_MAJOR}" STREQUAL "")
    set(hiredis_VERSION "${_hiredis_MAJOR}.${_hiredis_MINOR}.${_hiredis_PATCH}")
  endif()
endif()

find_package_handle_standard_args(hiredis
  REQUIRED_VARS hiredis_LIBRARY hiredis_INCLUDE_DIR
  VERSION_VAR hiredis_VERSION)

if(hiredis_FOUND AND NOT TARGET hiredis::hiredis)
  add_library(hiredis::hiredis UNKNOWN IMPORTED)
  set_target_properties(hiredis::hiredis PROPERTIES
    IMPORTED_LOCATION "${hiredis_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${hiredis_INCLUDE_DIR}")
endif()

mark_as_advanced(hiredis_INCLUDE_DIR hiredis_LIBRARY)
