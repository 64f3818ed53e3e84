// Deliberately broken plugins, one per compile definition, each exercising one loader refusal.
#include <cstddef>

#include "kproxy/plugin/abi.h"

#if defined(BROKEN_NULL_ENTRY)
extern "C" __attribute__((visibility("default"))) const kproxy_plugin_descriptor*
kproxy_plugin_entry(void) {
  return nullptr;
}
#elif defined(BROKEN_WRONG_ABI)
extern "C" __attribute__((visibility("default"))) const kproxy_plugin_descriptor*
kproxy_plugin_entry(void) {
  static const kproxy_plugin_descriptor d = {KPROXY_PLUGIN_ABI_VERSION + 1,
                                             sizeof(kproxy_plugin_descriptor),
                                             "future",
                                             "9.9",
                                             "from a future ABI",
                                             nullptr,
                                             nullptr,
                                             nullptr,
                                             nullptr,
                                             {}};
  return &d;
}
#elif defined(BROKEN_NO_ENTRY)
extern "C" __attribute__((visibility("default"))) int kproxy_plugin_something_else(void) {
  return 42;
}
#else
#error "pick a BROKEN_* variant"
#endif
