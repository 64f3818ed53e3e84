#pragma once
/// Kubernetes Events about Services, posted by the node's kproxy (core/v1 Events, as `kubectl
/// describe service` lists them: the Service's UID is looked up first, since kubectl selects
/// events by it). Best effort and asynchronous: post() queues and returns; a failure is logged
/// and counted, never retried, never blocks a sync. Needs `create` on events (deploy/rbac.yaml)
/// and `get` on services.
///
/// Thread-safety: post() and the counters may be called from any thread.

#include <cstdint>
#include <memory>
#include <string>

#include "kproxy/apiwatch/kubeconfig.h"
#include "kproxy/core/error.h"

namespace kproxy::apiwatch {

struct ServiceEvent {
  std::string ns;
  std::string service;
  std::string type = "Warning";  ///< "Normal" or "Warning"
  std::string reason;            ///< CamelCase, e.g. "FailedToSyncProxyRules"
  std::string message;
  std::int32_t count = 1;         ///< occurrences this event stands for
  double firstSeenWall = 0;       ///< wall seconds; 0: now
};

class EventRecorder {
 public:
  /// `node`: the reporting instance and source host (the node's name).
  static core::Result<std::unique_ptr<EventRecorder>> create(ClientConfig config, std::string node);
  ~EventRecorder();  ///< waits at most a few seconds for events in flight
  EventRecorder(const EventRecorder&) = delete;
  EventRecorder& operator=(const EventRecorder&) = delete;

  void post(ServiceEvent event);
  std::uint64_t posted() const;  ///< accepted by the API server
  std::uint64_t failed() const;  ///< refused or not delivered (logged)

 private:
  EventRecorder();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kproxy::apiwatch
