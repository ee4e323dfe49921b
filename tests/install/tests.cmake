# Install, package and diagnose (label `install`; docs/install.md): an
# install into a temporary prefix used by a consumer through find_package and
# pkg-config, the Debian package's contents and a trial unpack, shoal-info,
# and the one line per NCCL variable Shoal does not honour.
find_program(SHOAL_PKG_CONFIG NAMES pkg-config pkgconf)
find_program(SHOAL_DPKG_DEB dpkg-deb)
find_package(Python3 COMPONENTS Interpreter)

# The consumer built in this tree against the `nccl` target (the probe of the
# unhonoured-variable lines); the same source is built against installs.
add_executable(shoal_install_consumer install/consumer/consumer.c)
target_link_libraries(shoal_install_consumer PRIVATE nccl ${CMAKE_DL_LIBS})

set(_shoal_install_env "NCCL_SOCKET_IFNAME=lo")
add_test(NAME install.prefix_consumer
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/install/prefix_consumer_test.sh
          ${PROJECT_BINARY_DIR} ${CMAKE_CURRENT_SOURCE_DIR}/install ${CMAKE_COMMAND} ${SHOAL_PKG_CONFIG}
          ${CMAKE_C_COMPILER})
set_tests_properties(install.prefix_consumer PROPERTIES LABELS install TIMEOUT 240
  ENVIRONMENT "${_shoal_install_env}")

if(SHOAL_DPKG_DEB)
  add_test(NAME install.deb_package
    COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/install/deb_package_test.sh
            ${PROJECT_BINARY_DIR} ${CMAKE_CURRENT_SOURCE_DIR}/install ${PROJECT_VERSION} ${SHOAL_PKG_CONFIG}
            ${CMAKE_C_COMPILER})
  set_tests_properties(install.deb_package PROPERTIES LABELS install TIMEOUT 300
    ENVIRONMENT "${_shoal_install_env}")
endif()

add_test(NAME install.shoal_info
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/install/check_info.py $<TARGET_FILE:shoal_info>)
set_tests_properties(install.shoal_info PROPERTIES LABELS install TIMEOUT 120
  ENVIRONMENT "${_shoal_install_env}")

add_test(NAME install.unhonoured_once
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/install/check_unhonoured.py
          $<TARGET_FILE:shoal_install_consumer>)
set_tests_properties(install.unhonoured_once PROPERTIES LABELS install TIMEOUT 120
  ENVIRONMENT "${_shoal_install_env}")
