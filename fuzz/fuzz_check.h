#pragma once
// An invariant check for fuzz targets: on failure, print what broke and abort, so libFuzzer
// (and the replay driver) report the input as a crash.

#include <cstdio>
#include <cstdlib>

#define KPROXY_FUZZ_CHECK(condition, what)                                              \
  do {                                                                                  \
    if (!(condition)) {                                                                 \
      std::fprintf(stderr, "fuzz invariant failed at %s:%d: %s (%s)\n", __FILE__,       \
                   __LINE__, what, #condition);                                         \
      std::abort();                                                                     \
    }                                                                                   \
  } while (false)
