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
                                             {},
                                             nullptr,
                                             KPROXY_PLUGIN_ABI_MINOR};
  return &d;
}
#elif defined(BROKEN_OLD_DESCRIPTOR) || defined(BROKEN_SHORT_DESCRIPTOR)
// Not broken: a plugin built against the ABI 1.0 header, whose descriptor ends at `reserved`
// (no explain entry point). The host must load it and report that it cannot explain. With
// BROKEN_SHORT_DESCRIPTOR its struct_size is too small for even ABI 1.0 and must be refused.
namespace {
struct DescriptorV1_0 {
  uint32_t abi_version;
  uint32_t struct_size;
  const char* name;
  const char* version;
  const char* description;
  kproxy_backend* (*create)(const kproxy_host_api*, const kproxy_option*, size_t, kproxy_error*);
  int (*sync)(kproxy_backend*, const kproxy_snapshot*, const kproxy_snapshot*,
              const kproxy_changed_key*, size_t, uint32_t, kproxy_sync_result*, kproxy_error*);
  int (*cleanup)(kproxy_backend*, kproxy_error*);
  void (*destroy)(kproxy_backend*);
  void* reserved[8];
};
static_assert(sizeof(DescriptorV1_0) == KPROXY_PLUGIN_DESCRIPTOR_V1_0_SIZE);
int token;
kproxy_backend* create(const kproxy_host_api*, const kproxy_option*, size_t, kproxy_error*) {
  return reinterpret_cast<kproxy_backend*>(&token);
}
int sync(kproxy_backend*, const kproxy_snapshot*, const kproxy_snapshot*, const kproxy_changed_key*,
         size_t, uint32_t, kproxy_sync_result*, kproxy_error*) {
  return KPROXY_OK;
}
int cleanup(kproxy_backend*, kproxy_error*) { return KPROXY_OK; }
void destroy(kproxy_backend*) {}
}  // namespace
extern "C" __attribute__((visibility("default"))) const kproxy_plugin_descriptor*
kproxy_plugin_entry(void) {
#if defined(BROKEN_SHORT_DESCRIPTOR)
  constexpr uint32_t size = offsetof(DescriptorV1_0, reserved);
#else
  constexpr uint32_t size = sizeof(DescriptorV1_0);
#endif
  static const DescriptorV1_0 d = {KPROXY_PLUGIN_ABI_VERSION, size, "old", "1.0", "ABI 1.0 plugin",
                                   &create, &sync, &cleanup, &destroy, {}};
  // The host reads only what struct_size covers.
  return reinterpret_cast<const kproxy_plugin_descriptor*>(&d);
}
#elif defined(BROKEN_NO_ENTRY)
extern "C" __attribute__((visibility("default"))) int kproxy_plugin_something_else(void) {
  return 42;
}
#else
#error "pick a BROKEN_* variant"
#endif
