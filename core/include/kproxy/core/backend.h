#pragma once
/// The C++ interface every backend implements. Built-in backends reach the core through the
/// plugin ABI (see kproxy/plugins/loader.h, which adapts a loaded plugin to this interface).

#include <cstddef>
#include <span>
#include <string>
#include <string_view>

#include "kproxy/core/error.h"
#include "kproxy/core/snapshot.h"

namespace kproxy::core {

enum class SyncKind {
  kPartial,  ///< only `changed` differ from what the backend last applied
  kFull,     ///< re-read the kernel, reconcile everything (start-up, periodic, after a failure)
};

struct SyncRequest {
  const Snapshot* previous = nullptr;  ///< what was last applied successfully; null at first
  const Snapshot* next = nullptr;      ///< never null
  std::span<const ServicePortKey> changed;
  SyncKind kind = SyncKind::kFull;
};

struct SyncResult {
  std::size_t operations = 0;  ///< kernel objects added, changed or removed
  std::string summary;         ///< one line for the log, e.g. "chains+=2 rules-=1"
};

/// A kernel programming backend. Not thread-safe: the core calls it from one thread.
class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;
  /// Programs the kernel so that it matches `request.next`. On error the caller retries with a
  /// full sync. Where the kernel has transactions (nftables, iptables) the kernel keeps the
  /// previous rules; where it has none (IPVS) some steps may be applied, and the full sync
  /// finishes or repairs them.
  virtual Result<SyncResult> sync(const SyncRequest& request) = 0;
  /// Removes every kernel object this backend creates. Safe to call twice.
  virtual Result<void> cleanup() = 0;
};

}  // namespace kproxy::core
