# `cmake --install` and the CMake package holdpoint (docs/build.md, "Installing
# and consuming holdpoint from CMake"). Included at the end of the top-level
# CMakeLists.txt, once every target exists.
#
# Installed layout under the prefix:
#   include/holdpoint/<layer>/*.h       the public headers
#   lib/libholdpoint_*.a                the static libraries
#   bin/holdpoint, bin/holdpoint-doctor the CLI (`holdpoint doctor` runs the
#                                       holdpoint-doctor beside it)
#   lib/cmake/holdpoint/                holdpointConfig.cmake, its version
#                                       file, the exported targets, FindISAL
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# Consumers link holdpoint::core, holdpoint::torch and holdpoint::dist; the
# component libraries are exported too because the static libraries link them.
# The aliases let code in this tree use the same names.
# (The layer libraries of docs/architecture.md; holdpoint_core and
# holdpoint_torch are interface libraries that link them.)
set(HOLDPOINT_EXPORTED_LIBRARIES ${HOLDPOINT_CORE_LIBRARIES} holdpoint_core)
foreach(optional_library holdpoint_tensor holdpoint_state holdpoint_checkpoint holdpoint_trainer holdpoint_torch holdpoint_dist)
  if(TARGET ${optional_library})
    list(APPEND HOLDPOINT_EXPORTED_LIBRARIES ${optional_library})
  endif()
endforeach()
foreach(library IN LISTS HOLDPOINT_EXPORTED_LIBRARIES)
  string(REGEX REPLACE "^holdpoint_" "" export_name ${library})
  set_target_properties(${library} PROPERTIES EXPORT_NAME ${export_name})
  add_library(holdpoint::${export_name} ALIAS ${library})
endforeach()
# The public headers need C++20 (std::span, defaulted comparison operators).
target_compile_features(holdpoint_base PUBLIC cxx_std_20)

set(HOLDPOINT_INSTALL_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/holdpoint)

install(TARGETS ${HOLDPOINT_EXPORTED_LIBRARIES} EXPORT holdpointTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(DIRECTORY include/holdpoint DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} FILES_MATCHING PATTERN "*.h")

if(TARGET holdpoint)
  install(TARGETS holdpoint RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()
if(TARGET holdpoint-doctor)
  # A wheel's LibTorch lives in torch/lib, outside the loader's default
  # directories, and is linked by a raw linker flag that CMake's run-path
  # logic does not see: name its folder. Without it the installed doctor
  # would load whatever libtorch the system has (or none).
  # TORCH_LIBRARY: libtorch.so, found by TorchConfig.cmake.
  get_filename_component(holdpoint_torch_library_dir "${TORCH_LIBRARY}" DIRECTORY)
  if(NOT holdpoint_torch_library_dir IN_LIST CMAKE_CXX_IMPLICIT_LINK_DIRECTORIES)
    set_target_properties(holdpoint-doctor PROPERTIES INSTALL_RPATH "${holdpoint_torch_library_dir}")
  endif()
  install(TARGETS holdpoint-doctor RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()

install(EXPORT holdpointTargets NAMESPACE holdpoint:: DESTINATION ${HOLDPOINT_INSTALL_CMAKE_DIR}
  FILE holdpointTargets.cmake)

# What holdpointConfig.cmake needs to find the same dependencies again.
if(TARGET holdpoint_torch)
  set(HOLDPOINT_PACKAGE_TORCH_VERSION ${Torch_VERSION})
else()
  set(HOLDPOINT_PACKAGE_TORCH_VERSION "")
endif()
configure_package_config_file(cmake/holdpointConfig.cmake.in
  ${PROJECT_BINARY_DIR}/package/holdpointConfig.cmake
  INSTALL_DESTINATION ${HOLDPOINT_INSTALL_CMAKE_DIR})
# 0.x: a new minor version may change the API.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/package/holdpointConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES
  ${PROJECT_BINARY_DIR}/package/holdpointConfig.cmake
  ${PROJECT_BINARY_DIR}/package/holdpointConfigVersion.cmake
  cmake/FindISAL.cmake
  DESTINATION ${HOLDPOINT_INSTALL_CMAKE_DIR})
