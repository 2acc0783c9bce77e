# fs_add_library(NAME DIR DEPS...): one static library per folder, sources globbed from DIR
# (non-recursive) so that adding a file needs no CMake edit.
function(fs_add_library name dir)
  file(GLOB _srcs CONFIGURE_DEPENDS ${dir}/*.cpp)
  if(_srcs)
    add_library(${name} STATIC ${_srcs})
    target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR}/src)
    target_link_libraries(${name} PUBLIC fs_flags ${ARGN})
  else()
    add_library(${name} INTERFACE)
    target_include_directories(${name} INTERFACE ${PROJECT_SOURCE_DIR}/src)
    target_link_libraries(${name} INTERFACE fs_flags ${ARGN})
  endif()
endfunction()

# fs_add_test_dir(DIR LIBS...): one GoogleTest binary test_<dir> from tests/<dir>/*.cpp; its tests
# carry the ctest label test_<dir> (ctest -L test_ops_cuda selects the GPU tests).
include(GoogleTest)
function(fs_add_test_dir dir)
  file(GLOB _srcs CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/tests/${dir}/*.cpp)
  if(NOT _srcs)
    return()
  endif()
  string(REPLACE "/" "_" _name "test_${dir}")
  add_executable(${_name} ${_srcs})
  target_include_directories(${_name} PRIVATE ${PROJECT_SOURCE_DIR}/tests ${PROJECT_SOURCE_DIR}/src)
  target_link_libraries(${_name} PRIVATE ${ARGN} fs_source_dir GTest::gtest GTest::gtest_main GTest::gmock)
  # Tests that drive the CLI find the binary through FLASHSEEK_BIN (env overrides the build path).
  target_compile_definitions(${_name} PRIVATE FLASHSEEK_BIN_PATH="$<TARGET_FILE:flashseek>")
  if(FLASHSEEK_TEST_PCH)
    # (The test folders hold C++ files only.)
    target_precompile_headers(${_name} PRIVATE <gtest/gtest.h> <nlohmann/json.hpp> <algorithm> <cstdint>
                              <filesystem> <functional> <map> <memory> <string> <thread> <vector>)
  endif()
  add_dependencies(${_name} flashseek)
  gtest_discover_tests(${_name} DISCOVERY_TIMEOUT 60
    WORKING_DIRECTORY ${PROJECT_BINARY_DIR}
    PROPERTIES LABELS ${_name} TIMEOUT 300)
endfunction()
