# The installed package used the way a downstream project uses it (ctest -L
# consumer): install this build into a prefix under the build directory, then
# configure, build and run tests/consumer against it with find_package(holdpoint),
# the same compilers and the same CMAKE_PREFIX_PATH (that is, the same LibTorch).
# tests/consumer/check_install.cmake does the work; these are its inputs.
if(HOLDPOINT_WITH_TORCH)
  set(consumer_flags "")
  if(HOLDPOINT_SANITIZE)
    # The static libraries were compiled with ASan+UBSan; their consumer links the runtimes.
    set(consumer_flags "-fsanitize=address,undefined")
  endif()
  file(CONFIGURE OUTPUT ${CMAKE_CURRENT_BINARY_DIR}/consumer_settings.cmake CONTENT [==[
set(build_dir [[@PROJECT_BINARY_DIR@]])
set(consumer_source_dir [[@CMAKE_CURRENT_SOURCE_DIR@/consumer]])
set(public_header_dir [[@PROJECT_SOURCE_DIR@/include/holdpoint]])
set(work_dir [[@CMAKE_CURRENT_BINARY_DIR@/consumer]])
set(generator [[@CMAKE_GENERATOR@]])
set(build_type [[@CMAKE_BUILD_TYPE@]])
set(cxx_compiler [[@CMAKE_CXX_COMPILER@]])
set(prefix_path [[@CMAKE_PREFIX_PATH@]])
set(torch_dir [[@Torch_DIR@]])
set(extra_flags [[@consumer_flags@]])
]==] @ONLY)
  add_test(NAME consumer.find_package
    COMMAND ${CMAKE_COMMAND} -DSETTINGS=${CMAKE_CURRENT_BINARY_DIR}/consumer_settings.cmake
            -P ${CMAKE_CURRENT_SOURCE_DIR}/consumer/check_install.cmake)
  # It compiles and links a program against LibTorch: give it the machine.
  set_tests_properties(consumer.find_package PROPERTIES LABELS "consumer" RUN_SERIAL ON TIMEOUT 900)
endif()
