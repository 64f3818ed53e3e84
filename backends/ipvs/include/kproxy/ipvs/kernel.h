#pragma once
/// KernelIpvs: the only way the IPVS backend reaches the kernel's IPVS tables (virtual servers,
/// their real servers, the connection timeouts). The generic-netlink implementation sits beside
/// an in-memory fake with the kernel's error semantics, for unit tests.
/// Thread-safety: an adapter is not thread-safe; one owner uses it.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kproxy/backends/common/address.h"
#include "kproxy/core/error.h"

namespace kproxy::ipvs {

enum class Family : std::uint8_t { kIPv4, kIPv6 };
enum class Protocol : std::uint8_t { kTcp, kUdp, kSctp };

/// How IPVS forwards to a real server (IP_VS_CONN_F_*); Kubernetes uses masquerading (NAT).
enum class ForwardingMethod : std::uint8_t {
  kMasquerade = 0,
  kLocal = 1,
  kTunnel = 2,
  kDirectRoute = 3,
};

/// Virtual server flags (IP_VS_SVC_F_*). The kernel's own "hashed" flag is never shown.
inline constexpr std::uint32_t kFlagPersistent = 0x1;  ///< session affinity, `timeout` seconds
inline constexpr std::uint32_t kFlagOnePacket = 0x4;
inline constexpr std::uint32_t kFlagSourceHashFallback = 0x8;  ///< sh: skip unavailable servers
inline constexpr std::uint32_t kFlagSourceHashPort = 0x10;     ///< sh: hash the source port too

const char* toString(Family family);
const char* toString(Protocol protocol);  ///< "TCP", "UDP", "SCTP" (as ipvsadm prints them)
const char* toString(ForwardingMethod method);

/// One IPVS virtual server. It is identified by (family, protocol, address, port), or by
/// (family, fwmark) when fwmark is not 0; the other fields are its settings.
struct VirtualServer {
  Family family = Family::kIPv4;
  Protocol protocol = Protocol::kTcp;  ///< unused for a firewall-mark service
  backends::IPPrefix address{};        ///< a host address of `family`; unused with fwmark
  std::uint16_t port = 0;
  std::uint32_t fwmark = 0;            ///< not 0: a firewall-mark service
  std::string scheduler = "rr";        ///< "rr", "wrr", "lc", "sh", …: the kernel loads ip_vs_<name>
  std::uint32_t flags = 0;             ///< kFlag*
  std::uint32_t timeout = 0;           ///< persistence in seconds (with kFlagPersistent)
  /// Persistence granularity as a prefix length (clients in one prefix share a real server);
  /// nullopt: the host (32 or 128), which is what the kernel reports for a default service.
  std::optional<std::uint8_t> netmask;

  /// Whether both name the same kernel object (the identity fields only).
  bool sameIdentity(const VirtualServer& other) const;
  /// "TCP 10.96.0.10:80", "UDP [fd00::10]:53", "FWM 7 IPv4": as errors and logs name it.
  std::string describe() const;
  bool operator==(const VirtualServer&) const = default;
};

/// One real server (IPVS "destination") of a virtual server.
struct RealServer {
  backends::IPPrefix address{};  ///< a host address (the virtual server's family for masquerade)
  std::uint16_t port = 0;
  std::int32_t weight = 1;       ///< 0 takes it out of scheduling; existing connections stay
  ForwardingMethod forwarding = ForwardingMethod::kMasquerade;
  std::uint32_t upperThreshold = 0;  ///< 0: no limit of active connections
  std::uint32_t lowerThreshold = 0;
  // Read back from the kernel; ignored when adding or updating.
  std::uint32_t activeConnections = 0;
  std::uint32_t inactiveConnections = 0;
  std::uint32_t persistentConnections = 0;

  /// Whether both name the same real server (address and port).
  bool sameIdentity(const RealServer& other) const;
  /// Whether the settings one adds or updates are equal (the counters are not compared).
  bool sameSettings(const RealServer& other) const;
  /// "10.244.1.5:8080", "[fd00::5]:8080".
  std::string describe() const;
  bool operator==(const RealServer&) const = default;
};

/// IPVS connection timeouts in seconds (ipvsadm --set). 0 in setTimeouts leaves a value as is.
struct Timeouts {
  std::int32_t tcp = 0;
  std::int32_t tcpFin = 0;
  std::int32_t udp = 0;
  bool operator==(const Timeouts&) const = default;
};

/// What an adapter was doing when the kernel refused; names the error.
enum class IpvsOperation : std::uint8_t {
  kListVirtualServers,
  kListRealServers,
  kAddVirtualServer,
  kUpdateVirtualServer,
  kDeleteVirtualServer,
  kAddRealServer,
  kUpdateRealServer,
  kDeleteRealServer,
  kFlush,
  kGetTimeouts,
  kSetTimeouts,
};

/// The error for `errnum` returned by the kernel for `op`: the context names the operation, the
/// objects and what the errno means for IPVS ("no such virtual server" for ESRCH, "real server
/// exists" for EEXIST, "scheduler 'x' is not available (module ip_vs_x)" for ENOENT on a
/// virtual server add or update, …). ENOENT and ESRCH give kNotFound, EINTR/EAGAIN/ENOBUFS/
/// ENOMEM kTransient, anything else kKernel. The fake reports the same errors.
core::Error ipvsError(IpvsOperation op, int errnum, const VirtualServer* vs = nullptr,
                      const RealServer* rs = nullptr);

/// The kernel's IPVS tables in the caller's network namespace.
class KernelIpvs {
 public:
  virtual ~KernelIpvs() = default;

  /// Every virtual server (the settings as the kernel holds them; `netmask` nullopt for a host).
  virtual core::Result<std::vector<VirtualServer>> listVirtualServers() = 0;
  /// The real servers of `vs` (identity fields only are read), with their connection counters.
  /// ESRCH when `vs` does not exist.
  virtual core::Result<std::vector<RealServer>> listRealServers(const VirtualServer& vs) = 0;

  /// EEXIST when it exists; ENOENT when the scheduler cannot be loaded.
  virtual core::Result<void> addVirtualServer(const VirtualServer& vs) = 0;
  /// Replaces the settings (scheduler, flags, timeout, netmask). ESRCH when missing.
  virtual core::Result<void> updateVirtualServer(const VirtualServer& vs) = 0;
  /// Deletes it with its real servers. ESRCH when missing.
  virtual core::Result<void> deleteVirtualServer(const VirtualServer& vs) = 0;

  /// ESRCH when `vs` is missing; EEXIST when the real server exists. EINVAL for a masqueraded
  /// real server of the other family, and for any IPv4 real server while the namespace has no
  /// local routing table yet (no local address at all, not even lo up): the kernel checks the
  /// address's type there.
  virtual core::Result<void> addRealServer(const VirtualServer& vs, const RealServer& rs) = 0;
  /// Replaces weight, forwarding and thresholds. ENOENT when the real server is missing.
  virtual core::Result<void> updateRealServer(const VirtualServer& vs, const RealServer& rs) = 0;
  /// ENOENT when the real server is missing.
  virtual core::Result<void> deleteRealServer(const VirtualServer& vs, const RealServer& rs) = 0;

  /// Deletes every virtual server (of every owner) in the namespace.
  virtual core::Result<void> flush() = 0;

  virtual core::Result<Timeouts> timeouts() = 0;
  /// Sets the timeouts that are not 0.
  virtual core::Result<void> setTimeouts(const Timeouts& timeouts) = 0;
};

/// The real kernel over one generic netlink socket (family "IPVS", libnl-genl-3), in the
/// calling thread's network namespace at the time of the call. When the family is missing it
/// runs `modprobe ip_vs` once and looks again; kNotFound ("the kernel has no IPVS: …") when
/// it is still missing.
core::Result<std::unique_ptr<KernelIpvs>> makeNetlinkIpvs();

/// An in-memory IPVS with the kernel's refusals (EEXIST, ESRCH, ENOENT, the scheduler names it
/// knows) and the kernel's normalisation on read-back. Tests may inject one failure.
class FakeIpvs : public KernelIpvs {
 public:
  struct Entry {
    VirtualServer vs;
    std::vector<RealServer> realServers;
  };

  core::Result<std::vector<VirtualServer>> listVirtualServers() override;
  core::Result<std::vector<RealServer>> listRealServers(const VirtualServer& vs) override;
  core::Result<void> addVirtualServer(const VirtualServer& vs) override;
  core::Result<void> updateVirtualServer(const VirtualServer& vs) override;
  core::Result<void> deleteVirtualServer(const VirtualServer& vs) override;
  core::Result<void> addRealServer(const VirtualServer& vs, const RealServer& rs) override;
  core::Result<void> updateRealServer(const VirtualServer& vs, const RealServer& rs) override;
  core::Result<void> deleteRealServer(const VirtualServer& vs, const RealServer& rs) override;
  core::Result<void> flush() override;
  core::Result<Timeouts> timeouts() override;
  core::Result<void> setTimeouts(const Timeouts& timeouts) override;

  /// The next call of `op` fails with `errnum` (then the injection clears itself).
  void failNext(IpvsOperation op, int errnum) { failure_ = {op, errnum}; }

  /// Schedulers the kernel can load; others give ENOENT as a missing ip_vs_<name> module does.
  std::vector<std::string> schedulers{"rr", "wrr", "lc", "wlc", "lblc", "lblcr", "dh", "sh",
                                      "sed", "nq", "fo", "ovf", "mh", "twos"};
  /// In insertion order, as the kernel's hash table is not (list order is unspecified).
  std::vector<Entry> entries;
  /// The kernel's defaults (900 s, 120 s, 300 s).
  Timeouts currentTimeouts{900, 120, 300};
  std::size_t calls = 0;   ///< every call, to check that a caller issued none
  std::size_t writes = 0;  ///< calls that change the kernel (add, update, delete, flush, set)

 private:
  std::optional<core::Error> injected(IpvsOperation op, const VirtualServer* vs,
                                      const RealServer* rs);
  Entry* find(const VirtualServer& vs);
  std::optional<std::pair<IpvsOperation, int>> failure_;
};

}  // namespace kproxy::ipvs
