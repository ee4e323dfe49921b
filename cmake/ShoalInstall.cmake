# Install: the library with its soname links, the headers, and a CMake package.
include(GNUInstallDirs)
install(TARGETS nccl EXPORT shoalTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(FILES ${PROJECT_SOURCE_DIR}/include/nccl.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/shoal DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT shoalTargets NAMESPACE shoal:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/shoal)
