# cmake -DSETTINGS=<build>/tests/consumer_settings.cmake -P check_install.cmake
#
# The consumer test (tests/consumer.cmake): installs the build into a fresh
# prefix, checks the installed files, configures, builds and runs this folder's
# project against the prefix, and runs the installed `holdpoint doctor`. Any
# failure is a FATAL_ERROR (the test fails) that names the step and shows its output.
include(${SETTINGS})

function(run_step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE status OUTPUT_VARIABLE output ERROR_VARIABLE output)
  if(NOT status EQUAL 0)
    message(FATAL_ERROR "consumer test: ${what} failed (${status}):\n${output}")
  endif()
  set(step_output "${output}" PARENT_SCOPE)
endfunction()

set(prefix ${work_dir}/prefix)
file(REMOVE_RECURSE ${work_dir})
file(MAKE_DIRECTORY ${work_dir})

run_step("cmake --install" ${CMAKE_COMMAND} --install ${build_dir} --prefix ${prefix})

# Every public header, the package files and both programs.
file(GLOB_RECURSE public_headers RELATIVE ${public_header_dir} ${public_header_dir}/*.h)
set(expected bin/holdpoint bin/holdpoint-doctor lib/libholdpoint_format.a lib/libholdpoint_run.a lib/libholdpoint_tensor.a lib/libholdpoint_checkpoint.a
  lib/cmake/holdpoint/holdpointConfig.cmake lib/cmake/holdpoint/holdpointConfigVersion.cmake
  lib/cmake/holdpoint/holdpointTargets.cmake lib/cmake/holdpoint/FindISAL.cmake)
foreach(header IN LISTS public_headers)
  list(APPEND expected include/holdpoint/${header})
endforeach()
foreach(file IN LISTS expected)
  if(NOT EXISTS ${prefix}/${file})
    message(FATAL_ERROR "consumer test: the installation lacks ${file}")
  endif()
endforeach()

# The exported interface must not point into the source or build tree.
file(GLOB exported_target_files ${prefix}/lib/cmake/holdpoint/holdpointTargets*.cmake)
get_filename_component(source_root ${consumer_source_dir}/../.. ABSOLUTE)
foreach(file IN LISTS exported_target_files)
  file(READ ${file} exported)
  foreach(tree ${source_root} ${build_dir})
    string(FIND "${exported}" "${tree}/" at)
    if(NOT at EQUAL -1)
      message(FATAL_ERROR "consumer test: ${file} names a path in ${tree}")
    endif()
  endforeach()
endforeach()

# An initial cache rather than -D arguments: CMAKE_PREFIX_PATH is a list, and
# its semicolons would split it into several arguments on the way.
file(CONFIGURE OUTPUT ${work_dir}/initial_cache.cmake CONTENT [==[
set(CMAKE_BUILD_TYPE [[@build_type@]] CACHE STRING "")
set(CMAKE_CXX_COMPILER [[@cxx_compiler@]] CACHE FILEPATH "")
set(CMAKE_PREFIX_PATH [[@prefix@;@prefix_path@]] CACHE STRING "")
set(CMAKE_CXX_FLAGS [[@extra_flags@]] CACHE STRING "")
set(CMAKE_EXE_LINKER_FLAGS [[@extra_flags@]] CACHE STRING "")
]==] @ONLY)
run_step("configuring the consumer" ${CMAKE_COMMAND} -S ${consumer_source_dir} -B ${work_dir}/build -G ${generator}
  -C ${work_dir}/initial_cache.cmake)
run_step("building the consumer" ${CMAKE_COMMAND} --build ${work_dir}/build)

# The same LibTorch as the build that was installed.
file(STRINGS ${work_dir}/build/CMakeCache.txt consumer_torch_dir REGEX "^Torch_DIR:")
string(REGEX REPLACE "^Torch_DIR:[A-Z]+=" "" consumer_torch_dir "${consumer_torch_dir}")
file(REAL_PATH "${consumer_torch_dir}" consumer_torch_dir)
file(REAL_PATH "${torch_dir}" build_torch_dir)
if(NOT consumer_torch_dir STREQUAL build_torch_dir)
  message(FATAL_ERROR "consumer test: the consumer found Torch in ${consumer_torch_dir}, the build used ${build_torch_dir}")
endif()

run_step("running the consumer" ${work_dir}/build/holdpoint_consumer ${work_dir}/round_trip.pt)
if(NOT step_output MATCHES "holdpoint consumer: verified round trip")
  message(FATAL_ERROR "consumer test: the consumer did not report a verified round trip:\n${step_output}")
endif()
message(STATUS "${step_output}")

# The installed CLI finds the installed holdpoint-doctor, which loads the
# LibTorch it was built against (its run path), not another one on the system.
run_step("installed holdpoint doctor --json" ${prefix}/bin/holdpoint doctor --json)
string(JSON built_with ERROR_VARIABLE json_error GET "${step_output}" libtorch)
string(JSON runs_with ERROR_VARIABLE json_error GET "${step_output}" libtorch_runtime version)
if(json_error OR built_with STREQUAL "" OR NOT runs_with STREQUAL built_with)
  message(FATAL_ERROR "consumer test: the installed doctor was built with LibTorch '${built_with}' and runs with "
                      "'${runs_with}' ${json_error}:\n${step_output}")
endif()
message(STATUS "installed holdpoint doctor: LibTorch ${built_with}")
