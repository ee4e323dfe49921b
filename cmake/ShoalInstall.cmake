# Install layout (docs/install.md). libnccl.so.2 goes into a private directory,
# <libdir>/shoal, and the headers into <includedir>/shoal, so that installing
# Shoal never shadows NVIDIA's libnccl2/libnccl-dev for programs that did not
# ask for it: a program gets Shoal through -L/-rpath (pkg-config, CMake),
# LD_LIBRARY_PATH or LD_PRELOAD. Benchmarks go to <libexecdir>/shoal under
# their nccl-tests names; tools are bin/shoal-*.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)
set(SHOAL_INSTALL_LIBDIR ${CMAKE_INSTALL_LIBDIR}/shoal)
set(SHOAL_INSTALL_INCLUDEDIR ${CMAKE_INSTALL_INCLUDEDIR}/shoal)
set(SHOAL_INSTALL_LIBEXECDIR ${CMAKE_INSTALL_LIBEXECDIR}/shoal)
set(SHOAL_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/shoal)

install(TARGETS nccl EXPORT shoalTargets
  LIBRARY DESTINATION ${SHOAL_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${SHOAL_INSTALL_LIBDIR}
  INCLUDES DESTINATION ${SHOAL_INSTALL_INCLUDEDIR})
# <includedir>/shoal/nccl.h and <includedir>/shoal/shoal/shoal.h: one -I gives
# both <nccl.h> and <shoal/shoal.h>, and /usr/include/nccl.h stays NVIDIA's.
install(FILES ${PROJECT_SOURCE_DIR}/include/nccl.h DESTINATION ${SHOAL_INSTALL_INCLUDEDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/shoal DESTINATION ${SHOAL_INSTALL_INCLUDEDIR})

# find_package(shoal CONFIG): shoal::nccl.
install(EXPORT shoalTargets NAMESPACE shoal:: DESTINATION ${SHOAL_INSTALL_CMAKEDIR})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/shoalConfig.cmake.in
  ${PROJECT_BINARY_DIR}/shoalConfig.cmake INSTALL_DESTINATION ${SHOAL_INSTALL_CMAKEDIR})
# 0.x: a minor version may change the extensions (docs/install.md).
write_basic_package_version_file(${PROJECT_BINARY_DIR}/shoalConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/shoalConfig.cmake ${PROJECT_BINARY_DIR}/shoalConfigVersion.cmake
  DESTINATION ${SHOAL_INSTALL_CMAKEDIR})

# shoal.pc, written at install time for the prefix installed to (cmake
# --install --prefix, or /usr inside the Debian package).
set(_shoal_pc_template ${PROJECT_BINARY_DIR}/shoal.pc.template)
file(WRITE ${_shoal_pc_template}
"prefix=@SHOAL_PC_PREFIX@
libdir=\${prefix}/${SHOAL_INSTALL_LIBDIR}
includedir=\${prefix}/${SHOAL_INSTALL_INCLUDEDIR}

Name: shoal
Description: Shoal: NCCL ${SHOAL_NCCL_MAJOR}.${SHOAL_NCCL_MINOR}.${SHOAL_NCCL_PATCH}'s C API and ABI (libnccl.so.2) over pluggable transports
Version: ${PROJECT_VERSION}
Libs: -L\${libdir} -Wl,-rpath,\${libdir} -lnccl
Cflags: -I\${includedir}
")
install(CODE "
  set(SHOAL_PC_PREFIX \"\${CMAKE_INSTALL_PREFIX}\")
  set(_pc \"\$ENV{DESTDIR}\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_LIBDIR}/pkgconfig/shoal.pc\")
  message(STATUS \"Installing: \${_pc}\")
  configure_file(\"${_shoal_pc_template}\" \"\${_pc}\" @ONLY)
  list(APPEND CMAKE_INSTALL_MANIFEST_FILES \"\${_pc}\")
")

# Benchmarks: <libexecdir>/shoal/<name>_perf, finding the library through a
# relative RUNPATH (the tree may be moved or unpacked anywhere).
file(RELATIVE_PATH _shoal_libexec_to_lib /${SHOAL_INSTALL_LIBEXECDIR} /${SHOAL_INSTALL_LIBDIR})
set(SHOAL_BENCH_INSTALL_RPATH "\$ORIGIN/${_shoal_libexec_to_lib}")
get_property(_shoal_bench GLOBAL PROPERTY SHOAL_INSTALLED_BENCHMARKS)
foreach(b IN LISTS _shoal_bench)
  set_target_properties(${b} PROPERTIES INSTALL_RPATH "${SHOAL_BENCH_INSTALL_RPATH}")
  install(TARGETS ${b} RUNTIME DESTINATION ${SHOAL_INSTALL_LIBEXECDIR})
endforeach()

# Tools.
install(PROGRAMS ${PROJECT_SOURCE_DIR}/tools/shoal_hang_report.py
  DESTINATION ${CMAKE_INSTALL_BINDIR} RENAME shoal-hang-report)
install(FILES ${PROJECT_SOURCE_DIR}/README.md ${PROJECT_SOURCE_DIR}/docs/env.md
  ${PROJECT_SOURCE_DIR}/docs/install.md ${PROJECT_SOURCE_DIR}/docs/nccl-compat.md
  DESTINATION ${CMAKE_INSTALL_DOCDIR})

include(ShoalPackage)
