# Cross-compiles deltasync for 64-bit Arm Linux (Graviton, Grace) on a Debian
# x86-64 host with Debian's multiarch packages:
#   dpkg --add-architecture arm64
#   apt-get install g++-aarch64-linux-gnu qemu-user libhwy-dev:arm64 ...
# (scripts/test-arm64.sh installs them and uses this file). The tests run
# under qemu-aarch64 through CMAKE_CROSSCOMPILING_EMULATOR, so ctest and
# gtest_discover_tests work unchanged; QEMU_CPU picks the emulated CPU.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)

set(DS_CROSS_TRIPLE aarch64-linux-gnu)
set(CMAKE_C_COMPILER ${DS_CROSS_TRIPLE}-gcc)
set(CMAKE_CXX_COMPILER ${DS_CROSS_TRIPLE}-g++)
# Debian's multiarch layout: arm64 libraries in /usr/lib/aarch64-linux-gnu,
# headers shared in /usr/include, the cross libc in /usr/aarch64-linux-gnu.
set(CMAKE_LIBRARY_ARCHITECTURE ${DS_CROSS_TRIPLE})
set(CMAKE_FIND_ROOT_PATH /usr/${DS_CROSS_TRIPLE})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE BOTH)

# pkg-config: only the arm64 .pc files (and the architecture-independent ones).
set(ENV{PKG_CONFIG_LIBDIR} /usr/lib/${DS_CROSS_TRIPLE}/pkgconfig:/usr/share/pkgconfig)
set(ENV{PKG_CONFIG_PATH} "")

# No -L /usr/aarch64-linux-gnu: the arm64 -dev packages pull libc6:arm64,
# whose loader is /lib/ld-linux-aarch64.so.1, and the cross libc under
# /usr/aarch64-linux-gnu is another build of glibc (2.36-8cross1 against
# 2.36-9+deb12u*): with -L, qemu runs that tree's ld.so, which then loads
# /usr/lib/aarch64-linux-gnu/libc.so.6, and the first pthread_create hangs.
find_program(DS_QEMU_AARCH64 NAMES qemu-aarch64 qemu-aarch64-static)
if(DS_QEMU_AARCH64)
  set(CMAKE_CROSSCOMPILING_EMULATOR ${DS_QEMU_AARCH64})
endif()
