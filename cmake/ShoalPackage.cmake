# The Debian package: `cpack -G DEB` in a build directory gives
# shoal_<version>_amd64.deb with everything `cmake --install` puts under /usr.
# Its relationship to NVIDIA's libnccl2 is argued in
# docs/decisions/0016-debian-package.md: no Conflicts, Replaces or Provides,
# since no file collides (the library is /usr/lib/shoal/libnccl.so.2, the
# headers /usr/include/shoal/) and Shoal cannot stand in for libnccl2 without
# the user choosing it (LD_LIBRARY_PATH, LD_PRELOAD, -rpath).
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME shoal)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
  "NCCL ${SHOAL_NCCL_MAJOR}.${SHOAL_NCCL_MINOR}-compatible collectives (libnccl.so.2) over shm, TCP and libfabric")
set(CPACK_PACKAGE_DESCRIPTION
  "Shoal builds NCCL's C API and ABI as libnccl.so.2 on host and CUDA memory, with transports
 for shared memory, TCP and libfabric, verifiable collective plans and a cost-model tuner.
 The library is installed in a private directory, /usr/lib/shoal, and never shadows
 NVIDIA's libnccl2: use pkg-config shoal, find_package(shoal), LD_LIBRARY_PATH or
 LD_PRELOAD=/usr/lib/shoal/libnccl.so.2. shoal-info says what it will use on a machine.")
set(SHOAL_PACKAGE_MAINTAINER "Shoal developers <shoal@localhost>" CACHE STRING
  "Maintainer field of the Debian package")
set(CPACK_DEBIAN_PACKAGE_MAINTAINER "${SHOAL_PACKAGE_MAINTAINER}")
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION libs)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
# Depends from what the binaries link (dpkg-shlibdeps); the package's own
# libnccl.so.2 is found in its private directory.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS "usr/${CMAKE_INSTALL_LIBDIR}/shoal")
# libfabric is loaded at run time when asked for (FI_PROVIDER, NCCL_NET).
set(CPACK_DEBIAN_PACKAGE_SUGGESTS "libfabric1, libfabric-bin")
# Stripped, as Debian ships libraries (the build tree keeps the debug info);
# gzip: the package is made in a CI test, where xz costs minutes.
set(CPACK_STRIP_FILES ON)
set(CPACK_DEBIAN_COMPRESSION_TYPE gzip)
include(CPack)
