# inferx_module(NAME DEPS ...): one static library per folder of src/, built from every .cpp in it.
# Globbing (with CONFIGURE_DEPENDS) keeps a new file from touching a shared list.
function(inferx_module name)
  cmake_parse_arguments(ARG "" "" "DEPS;SOURCES_GLOB" ${ARGN})
  if(NOT ARG_SOURCES_GLOB)
    set(ARG_SOURCES_GLOB "*.cpp")
  endif()
  set(srcs)
  foreach(g IN LISTS ARG_SOURCES_GLOB)
    file(GLOB found CONFIGURE_DEPENDS "${CMAKE_CURRENT_SOURCE_DIR}/${g}")
    list(APPEND srcs ${found})
  endforeach()
  if(NOT srcs)  # a module whose sources are not written yet: headers only
    add_library(inferx_${name} INTERFACE)
    target_include_directories(inferx_${name} INTERFACE ${PROJECT_SOURCE_DIR}/src ${PROJECT_SOURCE_DIR}/include)
    target_link_libraries(inferx_${name} INTERFACE ${ARG_DEPS})
    return()
  endif()
  add_library(inferx_${name} STATIC ${srcs})
  target_include_directories(inferx_${name} PUBLIC ${PROJECT_SOURCE_DIR}/src ${PROJECT_SOURCE_DIR}/include)
  target_link_libraries(inferx_${name} PUBLIC ${ARG_DEPS} PRIVATE inferx_warnings)
endfunction()

# inferx_unit_test(MODULE DEPS ...): one GoogleTest binary per tests/unit/<module>/ folder.
function(inferx_unit_test module)
  cmake_parse_arguments(ARG "" "" "DEPS" ${ARGN})
  file(GLOB srcs CONFIGURE_DEPENDS "${CMAKE_CURRENT_SOURCE_DIR}/*.cpp")
  if(NOT srcs)
    return()
  endif()
  add_executable(test_${module} ${srcs})
  target_link_libraries(test_${module} PRIVATE ${ARG_DEPS} GTest::gtest_main inferx_warnings)
  target_compile_definitions(test_${module} PRIVATE
    INFERX_TESTDATA_DIR="${INFERX_TESTDATA_DIR}" INFERX_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
  gtest_discover_tests(test_${module} DISCOVERY_TIMEOUT 60 PROPERTIES ENVIRONMENT
    "INFERX_TESTDATA_DIR=${INFERX_TESTDATA_DIR}")
endfunction()
