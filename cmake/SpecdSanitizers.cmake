# Sanitizer and fuzzing builds (issue 15). They live in their own build folders, configured with
# clang and CUDA off (tools/ci/sanitizers.sh does it), never in the main g++ build/:
#   -DSPECD_SANITIZE=address  ASan + UBSan on every C/C++ target; UBSan does not recover, so
#                             any finding fails the test that hit it.
#   -DSPECD_SANITIZE=thread   TSan on every C/C++ target.
#   -DSPECD_FUZZ=ON           the libFuzzer targets of tests/fuzz (with -DSPECD_SANITIZE=address;
#                             every library also gets libFuzzer's coverage instrumentation).
# Debian's abseil, gRPC, protobuf, spdlog and gtest stay uninstrumented: see
# tools/ci/tsan.supp for what that means under TSan.
include_guard(GLOBAL)

set(SPECD_SANITIZE "" CACHE STRING "Sanitizers for every target: '', 'address' (ASan+UBSan), 'thread'")
set_property(CACHE SPECD_SANITIZE PROPERTY STRINGS "" address thread)
option(SPECD_FUZZ "Build the libFuzzer targets of tests/fuzz (clang only)" OFF)

set(_specd_c_cxx "$<COMPILE_LANGUAGE:C,CXX>")
if(SPECD_SANITIZE STREQUAL "address")
  add_compile_options("$<${_specd_c_cxx}:-fsanitize=address,undefined>"
                      "$<${_specd_c_cxx}:-fno-sanitize-recover=all>"
                      "$<${_specd_c_cxx}:-fno-omit-frame-pointer>")
  add_link_options(-fsanitize=address,undefined)
elseif(SPECD_SANITIZE STREQUAL "thread")
  add_compile_options("$<${_specd_c_cxx}:-fsanitize=thread>"
                      "$<${_specd_c_cxx}:-fno-omit-frame-pointer>")
  add_link_options(-fsanitize=thread)
elseif(NOT SPECD_SANITIZE STREQUAL "")
  message(FATAL_ERROR "SPECD_SANITIZE must be '', 'address' or 'thread', not '${SPECD_SANITIZE}'")
endif()

if(SPECD_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "SPECD_FUZZ needs clang (CC=clang CXX=clang++): libFuzzer is clang's")
  endif()
  if(NOT SPECD_SANITIZE STREQUAL "address")
    message(FATAL_ERROR "SPECD_FUZZ needs -DSPECD_SANITIZE=address (fuzz under ASan + UBSan)")
  endif()
  # Coverage feedback from every library; only the fuzz executables link libFuzzer's main.
  add_compile_options("$<${_specd_c_cxx}:-fsanitize=fuzzer-no-link>")
endif()
