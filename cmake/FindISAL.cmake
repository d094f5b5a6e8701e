# Finds Intel's ISA-L (Debian: libisal-dev), which ships no CMake package of
# its own. Used by holdpoint's build and installed beside holdpointConfig.cmake,
# which needs it because the static holdpoint_base links ISA-L privately and a
# consumer's link line must still name it.
#
# Result: the imported target ISAL::isal, ISAL_FOUND, and the cache entries
# ISAL_INCLUDE_DIR (holding isa-l/crc.h) and ISAL_LIBRARY.
find_path(ISAL_INCLUDE_DIR isa-l/crc.h)
find_library(ISAL_LIBRARY isal)
mark_as_advanced(ISAL_INCLUDE_DIR ISAL_LIBRARY)

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(ISAL REQUIRED_VARS ISAL_LIBRARY ISAL_INCLUDE_DIR)

if(ISAL_FOUND AND NOT TARGET ISAL::isal)
  add_library(ISAL::isal UNKNOWN IMPORTED)
  set_target_properties(ISAL::isal PROPERTIES
    IMPORTED_LOCATION "${ISAL_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${ISAL_INCLUDE_DIR}")
endif()
