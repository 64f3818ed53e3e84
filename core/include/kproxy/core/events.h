#pragma once
/// What a source (API watcher, manifest directory) tells the core. Implementations are
/// thread-safe: sources call them from their own threads.

#include <memory>
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
  /// ServiceCIDR objects (cluster-wide). The defaults ignore them, for sinks that do not care.
  virtual void serviceCIDRUpserted(ServiceCIDR /*cidr*/) {}
  virtual void serviceCIDRDeleted(const std::string& /*name*/) {}
  /// The same upserts from a source that keeps the decoded object itself: the object is
  /// immutable and never null, so a sink may keep a reference to it instead of a copy. The
  /// defaults copy it into the by-value form above.
  virtual void sharedServiceUpserted(std::shared_ptr<const Service> service) {
    serviceUpserted(*service);
  }
  virtual void sharedEndpointSliceUpserted(std::shared_ptr<const EndpointSlice> slice) {
    endpointSliceUpserted(*slice);
  }
  /// The initial list of Services (resp. EndpointSlices) has been delivered. No sync happens
  /// before both are signalled, so start-up never programs a half-known cluster.
  virtual void servicesSynced() = 0;
  virtual void endpointSlicesSynced() = 0;
};

}  // namespace kproxy::core
