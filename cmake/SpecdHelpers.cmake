# specd_cc_library / specd_cc_test: one library target per folder with explicit
# dependencies (the DESIGN.md arrows), in the spirit of abseil's absl_cc_library.
include_guard(GLOBAL)
include(${CMAKE_CURRENT_LIST_DIR}/SpecdSanitizers.cmake)

# specd_cc_library(NAME name [OBJECT] SRCS ... HDRS ... DEPS ... PRIVATE_DEPS ...)
# OBJECT: an object library, whose objects go into the library that links it (for a folder whose
# code one library above it both uses and is used by; see engine/runner/cuda).
function(specd_cc_library)
  cmake_parse_arguments(ARG "OBJECT" "NAME" "SRCS;HDRS;DEPS;PRIVATE_DEPS" ${ARGN})
  if(ARG_SRCS)
    if(ARG_OBJECT)
      add_library(${ARG_NAME} OBJECT ${ARG_SRCS} ${ARG_HDRS})
    else()
      add_library(${ARG_NAME} STATIC ${ARG_SRCS} ${ARG_HDRS})
    endif()
    target_link_libraries(${ARG_NAME} PUBLIC ${ARG_DEPS} PRIVATE ${ARG_PRIVATE_DEPS})
    target_include_directories(${ARG_NAME} PUBLIC ${PROJECT_SOURCE_DIR})
    target_compile_options(${ARG_NAME} PRIVATE ${SPECD_WARNINGS})
  else()
    add_library(${ARG_NAME} INTERFACE ${ARG_HDRS})
    target_link_libraries(${ARG_NAME} INTERFACE ${ARG_DEPS})
    target_include_directories(${ARG_NAME} INTERFACE ${PROJECT_SOURCE_DIR})
  endif()
endfunction()

# specd_cc_test(NAME name SRCS ... DEPS ... [LABELS unit|gpu|integration|slow])
function(specd_cc_test)
  cmake_parse_arguments(ARG "" "NAME;TIMEOUT" "SRCS;DEPS;LABELS" ${ARGN})
  if(NOT SPECD_BUILD_TESTS)
    return()
  endif()
  add_executable(${ARG_NAME} ${ARG_SRCS})
  # A sanitizer stage that leaves a test out need not build it (tools/ci/sanitizers.sh).
  if(ARG_NAME IN_LIST SPECD_UNBUILT_TESTS)
    set_target_properties(${ARG_NAME} PROPERTIES EXCLUDE_FROM_ALL ON)
  endif()
  target_link_libraries(${ARG_NAME} PRIVATE ${ARG_DEPS} GTest::gmock GTest::gtest_main)
  target_compile_options(${ARG_NAME} PRIVATE ${SPECD_WARNINGS})
  target_compile_definitions(${ARG_NAME} PRIVATE
    SPECD_SHARED_DIR="${SPECD_SHARED_DIR}"
    SPECD_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
  if(NOT ARG_LABELS)
    set(ARG_LABELS unit)
  endif()
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 600)
  endif()
  add_test(NAME ${ARG_NAME} COMMAND ${ARG_NAME})
  set_tests_properties(${ARG_NAME} PROPERTIES LABELS "${ARG_LABELS}" TIMEOUT ${ARG_TIMEOUT})
  if("gpu" IN_LIST ARG_LABELS)
    # GPU tests exit with 77 when no device is present: ctest reports them skipped.
    set_tests_properties(${ARG_NAME} PROPERTIES SKIP_RETURN_CODE 77)
  endif()
endfunction()

# specd_find_grpc_python(<var>): sets <var> to the first Python (the one CMake found, then
# Debian's /usr/bin/python3) that imports grpc and google.protobuf, or to "" when none does.
function(specd_find_grpc_python out)
  find_package(Python3 COMPONENTS Interpreter)
  foreach(_py ${Python3_EXECUTABLE} /usr/bin/python3)
    execute_process(COMMAND ${_py} -c "import grpc, google.protobuf" RESULT_VARIABLE _rc
                    OUTPUT_QUIET ERROR_QUIET)
    if(_rc EQUAL 0)
      set(${out} ${_py} PARENT_SCOPE)
      return()
    endif()
  endforeach()
  set(${out} "" PARENT_SCOPE)
endfunction()
