#pragma once
/// What a source (API watcher, manifest directory) tells the core. Implementations are
/// thread-safe: sources call them from their own threads.

#include <string>

#include "kproxy/core/model.h"

namespace kproxy::core {

class EventSink {
 public:
  virtual ~EventSink() = default;
  virtual void serviceUpserted(Service service) = 0;
  virtual void serviceDeleted(const std::string& ns, const std::string& name) = 0;
  virtual void endpointSliceUpserted(EndpointSlice slice) = 0;
  virtual void endpointSliceDeleted(const std::string& ns, const std::string& name) = 0;
  virtual void nodeUpserted(Node node) = 0;
  virtual void nodeDeleted(const std::string& name) = 0;
  /// The initial list of Services (resp. EndpointSlices) has been delivered. No sync happens
  /// before both are signalled, so start-up never programs a half-known cluster.
  virtual void servicesSynced() = 0;
  virtual void endpointSlicesSynced() = 0;
};

}  // namespace kproxy::core
