#pragma once
// Exposes core::Snapshot to plugins through the C accessors of kproxy_host_api.

#include "kproxy/core/snapshot.h"
#include "kproxy/plugin/abi.h"

namespace kproxy::plugins {

/// The host API table handed to every plugin. `host_ctx` is unused (logging goes to kproxy's log).
const kproxy_host_api* hostApi();

inline const kproxy_snapshot* toC(const core::Snapshot* snapshot) {
  return reinterpret_cast<const kproxy_snapshot*>(snapshot);
}
inline const core::Snapshot* fromC(const kproxy_snapshot* snapshot) {
  return reinterpret_cast<const core::Snapshot*>(snapshot);
}

}  // namespace kproxy::plugins
