#pragma once
/// A core snapshot seen through the plugin SDK (sdk::SnapshotView), as every backend sees it:
/// for host-side code that applies the shared service plan itself (/debug/services).

#include "kproxy/core/snapshot.h"
#include "kproxy/plugin/sdk.h"

namespace kproxy::plugins {

/// Borrows `snapshot`, which must outlive the view.
sdk::SnapshotView sdkView(const core::Snapshot& snapshot);

}  // namespace kproxy::plugins
