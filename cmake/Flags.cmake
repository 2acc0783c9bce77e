# Warning and optimisation flags shared by every target.
add_library(fs_flags INTERFACE)
target_compile_options(fs_flags INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers>)
# -O2 keeps IEEE semantics (no -ffast-math): the CPU backend is the oracle and must be
# batch-invariant, so reassociation is never allowed.
if(CMAKE_BUILD_TYPE STREQUAL "RelWithDebInfo" OR CMAKE_BUILD_TYPE STREQUAL "Release")
  target_compile_options(fs_flags INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-O2 -fno-fast-math -ffp-contract=off>)
endif()
option(FLASHSEEK_SANITIZE "Build with ASan/UBSan" OFF)
# Precompiled GoogleTest / JSON / standard headers for the test binaries: a fifth of a test file's
# compile time on a machine without a compiler cache (CI). Off by default: a PCH defeats ccache.
option(FLASHSEEK_TEST_PCH "Precompiled headers for the test binaries" OFF)
if(FLASHSEEK_SANITIZE)
  target_compile_options(fs_flags INTERFACE -fsanitize=address,undefined -fno-omit-frame-pointer)
  target_link_options(fs_flags INTERFACE -fsanitize=address,undefined)
endif()
# Coverage-guided fuzzing (clang's libFuzzer): every library instrumented for coverage with
# ASan/UBSan, plus one fuzz_<target> binary per harness in tests/fuzz (docs/security.md, Fuzzing).
# Configure with -DCMAKE_CXX_COMPILER=clang++ -DFLASHSEEK_CUDA=OFF.
option(FLASHSEEK_FUZZ "Build the libFuzzer harnesses (clang)" OFF)
if(FLASHSEEK_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "FLASHSEEK_FUZZ needs clang (libFuzzer): -DCMAKE_CXX_COMPILER=clang++")
  endif()
  # No coverage counters in the reference kernels (cmake/fuzz-coverage-ignore.txt): they parse
  # nothing and would only slow the harnesses that run the model for their seeds.
  target_compile_options(fs_flags INTERFACE -fsanitize=fuzzer-no-link,address,undefined
                         -fno-sanitize-recover=undefined -fno-omit-frame-pointer
                         -fsanitize-coverage-ignorelist=${PROJECT_SOURCE_DIR}/cmake/fuzz-coverage-ignore.txt)
  target_link_options(fs_flags INTERFACE -fsanitize=address,undefined)
endif()
# The checkout's path is compiled only into the files that look things up in it (tests, the
# tokenizer locator, benchmarks), so that library objects are identical across checkouts and a
# compiler cache shared between them hits.
add_library(fs_source_dir INTERFACE)
target_compile_definitions(fs_source_dir INTERFACE FLASHSEEK_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
