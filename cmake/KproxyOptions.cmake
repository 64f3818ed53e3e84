# Warnings, sanitizers and ccache, applied to every kproxy target.
# Off for users (a compiler false positive in a third-party header must not break their
# build); the test command turns it on.
option(KPROXY_WERROR "Treat warnings as errors" OFF)
option(KPROXY_SANITIZE "Build with AddressSanitizer and UndefinedBehaviorSanitizer" OFF)

find_program(CCACHE_PROGRAM ccache)
if(CCACHE_PROGRAM)
  set(CMAKE_C_COMPILER_LAUNCHER ${CCACHE_PROGRAM})
  set(CMAKE_CXX_COMPILER_LAUNCHER ${CCACHE_PROGRAM})
endif()

# g++ marks inline variables and function-local statics of inline functions STB_GNU_UNIQUE,
# and a shared object holding one can never be unloaded: the plugins of the modes not chosen
# stayed mapped (about 0.7 MiB resident in nftables mode) after their dlclose. Nothing C++ is
# shared across the plugin ABI, so each object keeping its own copy is what is wanted.
add_compile_options($<$<CXX_COMPILER_ID:GNU>:-fno-gnu-unique>)

add_library(kproxy_warnings INTERFACE)
# -Wshadow=local is g++ only (clang builds the fuzz targets).
target_compile_options(kproxy_warnings INTERFACE -Wall -Wextra $<$<CXX_COMPILER_ID:GNU>:-Wshadow=local> -Wnon-virtual-dtor)
if(KPROXY_WERROR)
  target_compile_options(kproxy_warnings INTERFACE -Werror)
endif()
if(KPROXY_SANITIZE)
  add_compile_options(-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
  add_link_options(-fsanitize=address,undefined)
  # Boost 1.74's Asio sees C++20 coroutines only with g++ or libc++; clang with libstdc++ has
  # them too.
  add_compile_definitions(BOOST_ASIO_HAS_CO_AWAIT=1 BOOST_ASIO_HAS_STD_COROUTINE=1)
endif()
install(TARGETS kproxy_warnings EXPORT kproxyTargets)

# libFuzzer targets (fuzz/): clang only, in a build directory of their own. Everything is
# instrumented for coverage and built with ASan+UBSan; only fuzz/ executables link libFuzzer.
option(KPROXY_FUZZ "Build the libFuzzer targets in fuzz/ (clang)" OFF)
if(KPROXY_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "KPROXY_FUZZ needs clang (libFuzzer): -DCMAKE_CXX_COMPILER=clang++-19 -DCMAKE_C_COMPILER=clang-19")
  endif()
  add_compile_options(-fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer
                      -fno-sanitize-recover=undefined -g)
  add_link_options(-fsanitize=address,undefined)
  # Boost 1.74's Asio sees C++20 coroutines only with g++ or libc++; clang with libstdc++ has
  # them too.
  add_compile_definitions(BOOST_ASIO_HAS_CO_AWAIT=1 BOOST_ASIO_HAS_STD_COROUTINE=1)
endif()
