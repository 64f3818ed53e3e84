#pragma once
// The IPVS generic netlink message format (include/uapi/linux/ip_vs.h): the nested service and
// destination attributes, encoded into and decoded from libnl messages. Kept apart from the
// socket so unit tests can check byte order and round trips without a kernel.

#include <cstdint>
#include <memory>

#include "kproxy/ipvs/kernel.h"

struct nl_msg;
struct nlattr;

namespace kproxy::ipvs::wire {

struct MessageDeleter {
  void operator()(nl_msg* msg) const;
};
using Message = std::unique_ptr<nl_msg, MessageDeleter>;

/// A request `cmd` (IPVS_CMD_*) for family id `familyId`; `flags` adds NLM_F_* (e.g. DUMP).
core::Result<Message> newRequest(int familyId, std::uint8_t cmd, int flags = 0);

/// What userspace refuses before the kernel is asked (kInvalidArgument, EINVAL): an address of
/// the other family, a scheduler name of 0 or 16+ characters, a netmask longer than the host,
/// a negative weight, a lower threshold above the upper one. The fake refuses the same.
core::Result<void> checkService(const VirtualServer& vs, bool fullEntry);
core::Result<void> checkDest(const RealServer& rs);

/// Appends IPVS_CMD_ATTR_SERVICE. `full`: with the settings (scheduler, flags, timeout,
/// netmask) that NEW_SERVICE and SET_SERVICE need; else the identity only.
/// kInvalidArgument when `vs` is inconsistent (address of the other family, empty scheduler).
core::Result<void> putService(nl_msg* msg, const VirtualServer& vs, bool full);
/// Appends IPVS_CMD_ATTR_DEST. `full`: with weight, forwarding and thresholds.
core::Result<void> putDest(nl_msg* msg, const RealServer& rs, bool full);
/// Appends the three timeout attributes, each only when not 0.
core::Result<void> putTimeouts(nl_msg* msg, const Timeouts& timeouts);

/// Decodes a nested IPVS_CMD_ATTR_SERVICE as the kernel sends it (hashed flag dropped, a host
/// netmask reported as nullopt).
core::Result<VirtualServer> parseService(nlattr* nested);
/// Decodes a nested IPVS_CMD_ATTR_DEST; the address family is IPVS_DEST_ATTR_ADDR_FAMILY when
/// present, else `serviceFamily` (kernels before 4.x do not send it).
core::Result<RealServer> parseDest(nlattr* nested, net::Family serviceFamily);

/// Decodes a whole reply message: the nested service, destination or the timeouts in it.
/// `msg` is a generic netlink message as received.
core::Result<VirtualServer> parseServiceReply(nl_msg* msg);
core::Result<RealServer> parseDestReply(nl_msg* msg, net::Family serviceFamily);
core::Result<Timeouts> parseTimeoutsReply(nl_msg* msg);

}  // namespace kproxy::ipvs::wire
