#pragma once
// Exposes core::Snapshot to plugins through the C accessors of kproxy_host_api.

#include "kproxy/core/snapshot.h"
#include "kproxy/plugin/abi.h"
#include "kproxy/plugins/plugin_metrics.h"

namespace kproxy::plugins {

/// The host API table handed to every plugin: logging goes to kproxy's log, `host_ctx` is
/// `metrics` (which must outlive every backend given the table; NULL: no metric functions).
kproxy_host_api makeHostApi(PluginMetrics* metrics);
/// A process-wide table without plugin metrics (for tests that read a snapshot through the SDK).
const kproxy_host_api* hostApi();

inline const kproxy_snapshot* toC(const core::Snapshot* snapshot) {
  return reinterpret_cast<const kproxy_snapshot*>(snapshot);
}
inline const core::Snapshot* fromC(const kproxy_snapshot* snapshot) {
  return reinterpret_cast<const core::Snapshot*>(snapshot);
}

}  // namespace kproxy::plugins
