#include "kproxy/ipvs/kernel.h"

#include <cerrno>

#include <fmt/format.h>

#include "kproxy/net/host_port.h"

namespace kproxy::ipvs {

const char* toString(Protocol protocol) {
  switch (protocol) {
    case Protocol::kTcp: return "TCP";
    case Protocol::kUdp: return "UDP";
    case Protocol::kSctp: return "SCTP";
  }
  return "?";
}

const char* toString(ForwardingMethod method) {
  switch (method) {
    case ForwardingMethod::kMasquerade: return "masquerade";
    case ForwardingMethod::kLocal: return "local";
    case ForwardingMethod::kTunnel: return "tunnel";
    case ForwardingMethod::kDirectRoute: return "direct-route";
  }
  return "?";
}

namespace {

std::string hostPort(const net::Prefix& address, std::uint16_t port) {
  return net::joinHostPort(address.addressText(), port);
}

}  // namespace

bool VirtualServer::sameIdentity(const VirtualServer& other) const {
  if (family != other.family || fwmark != other.fwmark) return false;
  if (fwmark != 0) return true;
  return protocol == other.protocol && address == other.address && port == other.port;
}

std::string VirtualServer::describe() const {
  if (fwmark != 0) return fmt::format("FWM {} {}", fwmark, toString(family));
  return fmt::format("{} {}", toString(protocol), hostPort(address, port));
}

bool RealServer::sameIdentity(const RealServer& other) const {
  return address == other.address && port == other.port;
}

bool RealServer::sameSettings(const RealServer& other) const {
  return sameIdentity(other) && weight == other.weight && forwarding == other.forwarding &&
         upperThreshold == other.upperThreshold && lowerThreshold == other.lowerThreshold;
}

std::string RealServer::describe() const { return hostPort(address, port); }

core::Error ipvsError(IpvsOperation op, int errnum, const VirtualServer* vs, const RealServer* rs) {
  const std::string vsName = vs != nullptr ? vs->describe() : std::string("?");
  const std::string rsName = rs != nullptr ? rs->describe() : std::string("?");
  std::string what;
  switch (op) {
    case IpvsOperation::kListVirtualServers: what = "list virtual servers"; break;
    case IpvsOperation::kListRealServers: what = "list real servers of " + vsName; break;
    case IpvsOperation::kAddVirtualServer: what = "add virtual server " + vsName; break;
    case IpvsOperation::kUpdateVirtualServer: what = "update virtual server " + vsName; break;
    case IpvsOperation::kDeleteVirtualServer: what = "delete virtual server " + vsName; break;
    case IpvsOperation::kAddRealServer: what = "add real server " + rsName + " to " + vsName; break;
    case IpvsOperation::kUpdateRealServer:
      what = "update real server " + rsName + " of " + vsName;
      break;
    case IpvsOperation::kDeleteRealServer:
      what = "delete real server " + rsName + " of " + vsName;
      break;
    case IpvsOperation::kFlush: what = "flush IPVS"; break;
    case IpvsOperation::kGetTimeouts: what = "read IPVS timeouts"; break;
    case IpvsOperation::kSetTimeouts: what = "set IPVS timeouts"; break;
  }
  const bool serviceOp = op == IpvsOperation::kAddVirtualServer ||
                         op == IpvsOperation::kUpdateVirtualServer;
  const bool realServerOp = op == IpvsOperation::kAddRealServer ||
                            op == IpvsOperation::kUpdateRealServer ||
                            op == IpvsOperation::kDeleteRealServer;
  std::string meaning;
  auto category = core::ErrorCategory::kKernel;
  switch (errnum) {
    case ESRCH:
      // The kernel's answer for a virtual server it does not have, whatever the operation.
      meaning = "no such virtual server";
      category = core::ErrorCategory::kNotFound;
      break;
    case ENOENT:
      if (serviceOp) {
        const std::string sched = vs != nullptr ? vs->scheduler : std::string("?");
        meaning = fmt::format("scheduler '{}' is not available (the kernel could not load module ip_vs_{})",
                              sched, sched);
      } else if (realServerOp) {
        meaning = "no such real server";
      } else {
        meaning = "not found";
      }
      category = core::ErrorCategory::kNotFound;
      break;
    case EEXIST:
      meaning = realServerOp ? "real server exists" : "virtual server exists";
      break;
    case EINTR:
    case EAGAIN:
    case ENOBUFS:
    case ENOMEM:
      category = core::ErrorCategory::kTransient;
      break;
    default: break;
  }
  std::string context = "ipvs: " + what;
  if (!meaning.empty()) context += ": " + meaning;
  return core::Error{category, errnum, std::move(context)};
}

}  // namespace kproxy::ipvs
