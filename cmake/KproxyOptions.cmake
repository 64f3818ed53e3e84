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

add_library(kproxy_warnings INTERFACE)
target_compile_options(kproxy_warnings INTERFACE -Wall -Wextra -Wshadow=local -Wnon-virtual-dtor)
if(KPROXY_WERROR)
  target_compile_options(kproxy_warnings INTERFACE -Werror)
endif()
if(KPROXY_SANITIZE)
  add_compile_options(-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
  add_link_options(-fsanitize=address,undefined)
endif()
install(TARGETS kproxy_warnings EXPORT kproxyTargets)
