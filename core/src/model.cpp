#include "kproxy/core/model.h"

namespace kproxy::core {

const char* toString(Protocol protocol) {
  switch (protocol) {
    case Protocol::kTCP: return "TCP";
    case Protocol::kUDP: return "UDP";
    case Protocol::kSCTP: return "SCTP";
  }
  return "unknown";
}

const char* toString(ServiceType type) {
  switch (type) {
    case ServiceType::kClusterIP: return "ClusterIP";
    case ServiceType::kNodePort: return "NodePort";
    case ServiceType::kLoadBalancer: return "LoadBalancer";
    case ServiceType::kExternalName: return "ExternalName";
  }
  return "unknown";
}

}  // namespace kproxy::core
