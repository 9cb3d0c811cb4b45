# What `cmake --install` puts under the prefix, and the files other projects find weft by:
# weftConfig.cmake (weft::weft, weft::nccl), weft.pc, and a Debian package through CPack.
#   bin/             weft-perf, weft-plan, weft-topo, weft-config
#   lib/             libweft.so.0 (and libweft.so), cmake/weft/, pkgconfig/weft.pc
#   lib/weft/        the NCCL drop-in: libweft_nccl.so and libnccl.so.2 beside it, out of the
#                    loader's default path so it never shadows a system NCCL by accident
#   include/weft/    weft.h (C), weft.hpp (C++17)
#   share/weft/      the tuning files;  share/doc/weft/  the README, docs/ and examples/
include(CMakePackageConfigHelpers)
set(WEFT_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/weft)
set(WEFT_NCCL_DIR ${CMAKE_INSTALL_LIBDIR}/weft)

# Installed binaries find libweft beside or above them wherever the prefix is, and keep the
# folders outside the prefix they were linked against (the CUDA toolkit's runtime).
file(RELATIVE_PATH lib_from_bin /${CMAKE_INSTALL_BINDIR} /${CMAKE_INSTALL_LIBDIR})
file(RELATIVE_PATH lib_from_nccl /${WEFT_NCCL_DIR} /${CMAKE_INSTALL_LIBDIR})
set_target_properties(weft PROPERTIES INSTALL_RPATH_USE_LINK_PATH ON)
install(TARGETS weft EXPORT weftTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/weft DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})

if(WEFT_HAVE_NCCL_SHIM)
  set_target_properties(weft_nccl PROPERTIES EXPORT_NAME nccl INSTALL_RPATH "\$ORIGIN/${lib_from_nccl}"
                        INSTALL_RPATH_USE_LINK_PATH ON)
  install(TARGETS weft_nccl EXPORT weftTargets LIBRARY DESTINATION ${WEFT_NCCL_DIR})
  install(FILES $<TARGET_FILE_DIR:weft_nccl>/libnccl.so.2 DESTINATION ${WEFT_NCCL_DIR})
endif()

if(WEFT_TOOLS)
  foreach(tool weft-perf weft-plan weft-topo weft-config)
    set_target_properties(${tool} PROPERTIES INSTALL_RPATH "\$ORIGIN/${lib_from_bin}"
                          INSTALL_RPATH_USE_LINK_PATH ON)
    install(TARGETS ${tool} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
  endforeach()
  install(FILES ${PROJECT_SOURCE_DIR}/examples/allreduce_threads.cpp
                ${PROJECT_SOURCE_DIR}/examples/allreduce.c ${PROJECT_SOURCE_DIR}/examples/CMakeLists.txt
          DESTINATION ${CMAKE_INSTALL_DOCDIR}/examples)
endif()
install(DIRECTORY ${PROJECT_SOURCE_DIR}/perf/tuning/ DESTINATION ${CMAKE_INSTALL_DATADIR}/weft/tuning
        FILES_MATCHING PATTERN "*.json")
# The Python package (python/weft, ctypes over weft.h): beside the library, which it finds three
# or four directories up (<libdir>/python3/dist-packages/weft).
install(DIRECTORY ${PROJECT_SOURCE_DIR}/python/weft DESTINATION ${CMAKE_INSTALL_LIBDIR}/python3/dist-packages
        FILES_MATCHING PATTERN "*.py")
install(FILES ${PROJECT_SOURCE_DIR}/README.md DESTINATION ${CMAKE_INSTALL_DOCDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/docs/ DESTINATION ${CMAKE_INSTALL_DOCDIR} FILES_MATCHING PATTERN "*.md")

# find_package(weft): relocatable, the prefix is found from the file's own place.
install(EXPORT weftTargets NAMESPACE weft:: DESTINATION ${WEFT_CMAKE_DIR})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/weftConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/weftConfig.cmake
                              INSTALL_DESTINATION ${WEFT_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/weftConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/weftConfig.cmake ${PROJECT_BINARY_DIR}/weftConfigVersion.cmake
        DESTINATION ${WEFT_CMAKE_DIR})

# pkg-config: relocatable too (prefix from ${pcfiledir}).
file(RELATIVE_PATH WEFT_PC_PREFIX_FROM_PCDIR /${CMAKE_INSTALL_LIBDIR}/pkgconfig /)
string(REGEX REPLACE "/$" "" WEFT_PC_PREFIX_FROM_PCDIR "${WEFT_PC_PREFIX_FROM_PCDIR}")
configure_file(${PROJECT_SOURCE_DIR}/cmake/weft.pc.in ${PROJECT_BINARY_DIR}/weft.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/weft.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# `cpack -G DEB` in the build folder: weft_<version>_<arch>.deb installing under /usr. The CUDA
# runtime comes from the CUDA toolkit (no Debian package owns it), so it is not a dependency.
if(PROJECT_IS_TOP_LEVEL)
  set(CPACK_PACKAGE_NAME weft)
  set(CPACK_PACKAGE_VENDOR weft)
  set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "${PROJECT_DESCRIPTION}")
  set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
  set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
  set(CPACK_DEBIAN_PACKAGE_MAINTAINER "weft developers")
  set(CPACK_DEBIAN_PACKAGE_SECTION libs)
  set(deps "libc6, libstdc++6, libhwloc15, libexpat1")
  if(WEFT_HAVE_UCX)
    string(APPEND deps ", libucx0")
  endif()
  set(CPACK_DEBIAN_PACKAGE_DEPENDS "${deps}")
  include(CPack)
endif()
