#pragma once
/// The IPVS backend's view of the kernel, three interfaces with a real adapter and an in-memory
/// fake each (fake_kernel.cpp):
///  - KernelIpvs: the only way the backend reaches the kernel's IPVS tables (virtual servers,
///    their real servers, the connection timeouts), over generic netlink (kernel_netlink.cpp);
///  - KernelDummyLink: the kube-ipvs0 dummy link and its addresses, over rtnetlink
///    (kernel_link.cpp);
///  - KernelIpsets: the ipsets, with `ipset save` / `ipset restore -exist` (kernel_ipset.cpp);
/// and the kernel parameters it sets through kernel/'s Sysctls (kproxy/kernel/sysctl.h), whose
/// fake starts from freshSysctls() here.
/// The fakes report the kernel's and the tools' errors. In --dry-run each goes through a
/// printing decorator over its fake (kernel_printing.cpp; the sysctls through kernel/'s
/// PrintingSysctls).
/// Thread-safety: an adapter is not thread-safe; one owner uses it.

#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "kproxy/backends/common/chain_names.h"
#include "kproxy/core/error.h"
#include "kproxy/kernel/process.h"
#include "kproxy/kernel/sysctl.h"
#include "kproxy/net/ip.h"

namespace kproxy::ipvs {

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

const char* toString(Protocol protocol);  ///< "TCP", "UDP", "SCTP" (as ipvsadm prints them)
const char* toString(ForwardingMethod method);

/// One IPVS virtual server. It is identified by (family, protocol, address, port), or by
/// (family, fwmark) when fwmark is not 0; the other fields are its settings.
struct VirtualServer {
  net::Family family = net::Family::kIPv4;
  Protocol protocol = Protocol::kTcp;  ///< unused for a firewall-mark service
  net::Prefix address{};        ///< a host address of `family`; unused with fwmark
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
  net::Prefix address{};  ///< a host address (the virtual server's family for masquerade)
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

// ---------------------------------------------------------------------------------------
// kube-ipvs0

// KernelDummyLink: the dummy interface (kube-ipvs0) that IPVS mode binds every service address
// to, so that the node accepts packets for them and IPVS sees them at INPUT. Like kube-proxy,
// kproxy creates it and leaves it down: the kernel still adds a local route for each address
// of a down link (IPv4, and IPv6 on the kernels tested, 6.1). Addresses are host prefixes
// (/32, /128) of scope global, as kube-proxy binds them.

/// The interface name kube-proxy uses and runbooks look for (the catalogue's, chain_names.h).
inline constexpr const char* kDummyLinkName = backends::kIpvsDummyInterface;

class KernelDummyLink {
 public:
  virtual ~KernelDummyLink() = default;

  /// Creates dummy link `name` unless it exists. Returns whether it existed. An existing link
  /// of another type is an error (EEXIST): kproxy never takes over someone else's interface.
  virtual core::Result<bool> ensureLink(const std::string& name) = 0;
  /// Deletes dummy link `name` with its addresses; a missing link is not an error, a link of
  /// another type is (EINVAL, left alone).
  virtual core::Result<void> deleteLink(const std::string& name) = 0;
  /// The addresses on `name` (both families, without link-local IPv6 ones), as host prefixes.
  /// ENODEV when the link is missing.
  virtual core::Result<std::vector<net::Prefix>> listAddresses(const std::string& name) = 0;
  /// Binds `address` (a host address) to `name`. EEXIST when it is bound already; ENODEV
  /// when the link is missing.
  virtual core::Result<void> addAddress(const std::string& name, const net::Prefix& address) = 0;
  /// Unbinds `address` from `name`. EADDRNOTAVAIL when it is not bound; ENODEV when the link
  /// is missing.
  virtual core::Result<void> deleteAddress(const std::string& name,
                                           const net::Prefix& address) = 0;
};

/// The real kernel over one NETLINK_ROUTE socket (libnl-route-3), in the calling thread's
/// network namespace when made.
core::Result<std::unique_ptr<KernelDummyLink>> makeNetlinkDummyLink();

/// In-memory links with the kernel's refusals.
class FakeDummyLink : public KernelDummyLink {
 public:
  struct FakeLink {
    std::string kind = "dummy";
    std::vector<net::Prefix> addresses;
  };

  core::Result<bool> ensureLink(const std::string& name) override;
  core::Result<void> deleteLink(const std::string& name) override;
  core::Result<std::vector<net::Prefix>> listAddresses(const std::string& name) override;
  core::Result<void> addAddress(const std::string& name, const net::Prefix& address) override;
  core::Result<void> deleteAddress(const std::string& name,
                                   const net::Prefix& address) override;

  std::vector<std::pair<std::string, FakeLink>> links;  ///< name → link, in creation order

 private:
  FakeLink* find(const std::string& name);
};

/// The error for `errnum` returned for `what` ("add address 10.0.0.1 to kube-ipvs0"): ENODEV,
/// EEXIST, EADDRNOTAVAIL named. Shared by the adapter and the fake.
core::Error linkError(const std::string& what, int errnum);

// ---------------------------------------------------------------------------------------
// ipsets

// KernelIpsets: the ipsets IPVS mode matches in iptables, read with `ipset save` and changed
// with `ipset restore -exist` through the shared process runner (no shell). `-exist` makes
// every line idempotent: creating an existing set of the same type, adding a present entry and
// deleting an absent one are not errors, so a restore can be repeated after a failure.
// FakeIpsets applies restore input to an in-memory table, for unit tests and --dry-run.

/// What `ipset save` says: each set's create line and its entries ("10.96.0.10,tcp:80").
struct IpsetState {
  struct Set {
    std::string createLine;  ///< as saved, with the kernel's extra settings
    std::set<std::string> entries;
  };
  std::map<std::string, Set> sets;
};

/// Parses `ipset save` output ("create NAME TYPE ..." and "add NAME ENTRY" lines; others are
/// ignored). An "add" for a set not created before it is an error (kDecode).
core::Result<IpsetState> parseIpsetSave(std::string_view text);

class KernelIpsets {
 public:
  virtual ~KernelIpsets() = default;
  /// `ipset save`: every set of the namespace.
  virtual core::Result<IpsetState> save() = 0;
  /// `ipset restore -exist` of `input` ("create ...", "add ...", "del ...", "destroy ..." lines).
  /// A refusal is an error of category kKernel quoting what the tool said.
  virtual core::Result<void> restore(std::string_view input) = 0;
  virtual std::string describe() const = 0;
};

/// The ipset program found in PATH or sbin, run through `runner`. Error when it is missing.
core::Result<std::unique_ptr<KernelIpsets>> makeProcessIpsets(kernel::ProcessRunner& runner);

/// In memory: restore lines applied in order with `-exist`'s meaning; an unknown set in "add",
/// "del" or "destroy" is refused as the tool refuses it, and nothing of that input is kept.
class FakeIpsets final : public KernelIpsets {
 public:
  core::Result<IpsetState> save() override;
  core::Result<void> restore(std::string_view input) override;
  std::string describe() const override { return "fake ipset"; }

  IpsetState state;
  std::vector<std::string> restores;  ///< every input, in order
  bool refuseNext = false;            ///< refuse the next restore
};

// ---------------------------------------------------------------------------------------
// sysctls

/// What a fresh kernel with IPVS holds for the parameters IPVS mode sets (net/ipv4/vs/*, and
/// arp_ignore / arp_announce with ipvs-strict-arp): a kernel::FakeSysctls's start.
std::map<std::string, std::int64_t> freshSysctls();

// ---------------------------------------------------------------------------------------
// --dry-run

// The printing decorators --dry-run gives the backend (kernel_printing.cpp): each prints every
// change it is asked to make, as the command that would make it, then hands it to `inner`,
// which answers every read. Over the empty fakes, a dry run plans as on an empty node and its
// later steps see what the earlier ones would have done. A change the inner refuses is printed
// too: the kernel would have been sent it.

/// Virtual and real servers and timeouts in ipvsadm notation (ipvsadmCommand, backend.h):
/// `ipvsadm -A -t 10.96.0.10:80 -s rr`, `ipvsadm -a -t 10.96.0.10:80 -r 10.244.1.5:8080 -m -w 1`,
/// `ipvsadm --set 900 120 300`, `ipvsadm -C`.
class PrintingIpvs final : public KernelIpvs {
 public:
  PrintingIpvs(std::unique_ptr<KernelIpvs> inner, std::FILE* out);
  core::Result<std::vector<VirtualServer>> listVirtualServers() override { return inner_->listVirtualServers(); }
  core::Result<std::vector<RealServer>> listRealServers(const VirtualServer& vs) override {
    return inner_->listRealServers(vs);
  }
  core::Result<void> addVirtualServer(const VirtualServer& vs) override;
  core::Result<void> updateVirtualServer(const VirtualServer& vs) override;
  core::Result<void> deleteVirtualServer(const VirtualServer& vs) override;
  core::Result<void> addRealServer(const VirtualServer& vs, const RealServer& rs) override;
  core::Result<void> updateRealServer(const VirtualServer& vs, const RealServer& rs) override;
  core::Result<void> deleteRealServer(const VirtualServer& vs, const RealServer& rs) override;
  core::Result<void> flush() override;
  core::Result<Timeouts> timeouts() override { return inner_->timeouts(); }
  core::Result<void> setTimeouts(const Timeouts& timeouts) override;

 private:
  std::unique_ptr<KernelIpvs> inner_;
  std::FILE* out_;
};

/// The link and its addresses in ip(8) notation: `ip link add kube-ipvs0 type dummy` (only when
/// the link is created), `ip link del kube-ipvs0`, `ip addr add 10.96.0.10/32 dev kube-ipvs0`.
class PrintingDummyLink final : public KernelDummyLink {
 public:
  PrintingDummyLink(std::unique_ptr<KernelDummyLink> inner, std::FILE* out);
  core::Result<bool> ensureLink(const std::string& name) override;
  core::Result<void> deleteLink(const std::string& name) override;
  core::Result<std::vector<net::Prefix>> listAddresses(const std::string& name) override {
    return inner_->listAddresses(name);
  }
  core::Result<void> addAddress(const std::string& name, const net::Prefix& address) override;
  core::Result<void> deleteAddress(const std::string& name, const net::Prefix& address) override;

 private:
  std::unique_ptr<KernelDummyLink> inner_;
  std::FILE* out_;
};

/// Each restore as `# ipset restore -exist` and its input.
class PrintingIpsets final : public KernelIpsets {
 public:
  PrintingIpsets(std::unique_ptr<KernelIpsets> inner, std::FILE* out);
  core::Result<IpsetState> save() override { return inner_->save(); }
  core::Result<void> restore(std::string_view input) override;
  std::string describe() const override { return inner_->describe(); }

 private:
  std::unique_ptr<KernelIpsets> inner_;
  std::FILE* out_;
};

}  // namespace kproxy::ipvs
