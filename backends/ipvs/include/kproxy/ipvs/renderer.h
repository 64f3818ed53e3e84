#pragma once
/// IpvsRenderer: sdk service ports → what IPVS mode programs, as data, in upstream kube-proxy's
/// layout and names (pkg/proxy/ipvs/proxier.go, ipset.go), decided by the shared service plan.
///
/// Per service port: the IPVS virtual servers (ClusterIP, each externalIP, each LoadBalancer
/// IP, the NodePort on each NodePort address) with the real servers of the pool the plan gives
/// that traffic; the addresses bound to the dummy interface `kube-ipvs0`; the ipset entries
/// (upstream's sets, `add SET ENTRY` as `ipset save` prints and `ipset restore` reads them);
/// and the few iptables rules of its own that kproxy adds. Globally: the fixed iptables
/// chains and rules of upstream's IPVS mode, matching the sets with `-m set --match-set`, the
/// jumps from the built-in chains, and the ipset definitions. Every iptables rule is rendered
/// exactly as `iptables-save` prints it.
///
/// Where this follows the service plan rather than upstream's IPVS mode, and why: the numbered
/// notes of docs/upstream-differences.md, "IPVS mode" (each place is marked "plan:" in the source).
///
/// Thread-safety: pure functions of their inputs; an IpvsRenderer is not mutated by renders.

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kproxy/plan/options.h"
#include "kproxy/iptables/renderer.h"
#include "kproxy/plan/service_plan.h"
#include "kproxy/plugin/sdk.h"

namespace kproxy::ipvs {

/// Upstream's default scheduler.
inline constexpr std::string_view kDefaultScheduler = "rr";

/// Settings that shape what is rendered, parsed from the plugin's options.
struct RenderConfig {
  std::string scheduler = std::string(kDefaultScheduler);  ///< option ipvs-scheduler
  /// The options every backend reads alike (detect-local-mode and its CIDRs or interface,
  /// masquerade-all and the masquerade bit, nodeport-addresses, node-ips), parsed once by the
  /// plan (plan/options.h) and carried whole.
  plan::CommonOptions common;
  /// MASQUERADE --random-fully (when the iptables tool and kernel support it).
  bool randomFully = true;

  std::uint32_t mark() const { return 1u << common.masqueradeBit; }
  std::string markHex() const;  ///< "0x4000"
  /// The bit every IPVS firewall mark of kproxy's carries (bit 28, or 29 when the masquerade
  /// bit is 28): how KUBE-MARK-MASQ tells marked packets, and a restart or --cleanup tells
  /// kproxy's firewall-mark virtual servers from others'.
  std::uint32_t fwmarkTag() const { return common.masqueradeBit == 28 ? 1u << 29 : 1u << 28; }
  /// The firewall mark of one virtual server of a service port: the tag bit and 28 bits of a
  /// hash of (family, port key, `pool`), without the masquerade bit and kubelet's 0x8000;
  /// stable across restarts, so nothing is rebuilt when kproxy starts again.
  std::uint32_t fwmarkOf(net::Family family, std::string_view portKey, std::string_view pool) const;
};

/// Builds a RenderConfig from plugin options (the common ones and ipvs-scheduler, one of the
/// kernel's schedulers); an error names the bad option.
sdk::Expected<RenderConfig> parseRenderConfig(const sdk::Options& options);

// ---------------------------------------------------------------------------------------
// IPVS

/// Which of the port's addresses a virtual server answers on.
enum class Traffic : std::uint8_t { kClusterIP, kExternalIP, kLoadBalancer, kNodePort };

struct PlannedRealServer {
  std::string address;
  std::uint16_t port = 0;
  std::uint32_t weight = 1;  ///< upstream always programs 1
  bool operator==(const PlannedRealServer&) const = default;
  auto operator<=>(const PlannedRealServer&) const = default;
};

/// One address of a service port that a firewall-mark virtual server answers for.
struct MarkedAddress {
  std::string address;
  std::uint16_t port = 0;
  Traffic traffic = Traffic::kClusterIP;
  bool operator==(const MarkedAddress&) const = default;
};

struct PlannedVirtualServer {
  net::Family family = net::Family::kIPv4;
  sdk::Protocol protocol = sdk::Protocol::kTCP;  ///< with fwmark: the protocol of the marked traffic
  std::string address;     ///< empty with fwmark
  std::uint16_t port = 0;  ///< 0 with fwmark
  /// Not 0: a firewall-mark virtual server (ClientIP affinity) for the `marked` addresses.
  std::uint32_t fwmark = 0;
  std::vector<MarkedAddress> marked;
  std::string scheduler;
  /// ClientIP affinity: IPVS persistence with the affinity timeout.
  bool persistent = false;
  std::uint32_t timeoutSeconds = 0;
  /// The "mh" scheduler's fallback flag (upstream sets it for mh).
  bool sourceHashFallback = false;
  Traffic traffic = Traffic::kClusterIP;
  /// Sorted, each once.
  std::vector<PlannedRealServer> realServers;

  /// Upstream's VirtualServer.String(): "10.96.0.10:53/UDP", "[fd00::a]:80/TCP"; "FWM 268435457
  /// IPv4" for a firewall-mark virtual server (as the kernel adapter describes it).
  std::string key() const;
  /// Whether it answers `address`:`port` (a marked address, or its own).
  bool answers(std::string_view address, std::uint16_t port) const;
  bool operator==(const PlannedVirtualServer&) const = default;
};

// ---------------------------------------------------------------------------------------
// ipsets

enum class SetId : std::uint8_t {
  kLoopBack,
  kClusterIP,
  kExternalIP,
  kExternalIPLocal,
  kLoadBalancer,
  kLoadBalancerFW,
  kLoadBalancerLocal,
  kLoadBalancerSourceIP,
  kLoadBalancerSourceCIDR,
  kNodePortTCP,
  kNodePortLocalTCP,
  kNodePortUDP,
  kNodePortLocalUDP,
  kNodePortSCTP,
  kNodePortLocalSCTP,
  kHealthCheckNodePort,
  kIPVSIPs,
};

/// Every set, in upstream's ipsetInfo order.
std::span<const SetId> allSets();

/// The set's name: upstream's, with "KUBE-" made "KUBE-6-" for IPv6 and cut to ipset's 31
/// characters ("KUBE-6-LOAD-BALANCER-SOURCE-CID").
std::string setName(SetId set, net::Family family);

struct IpsetDefinition {
  std::string name;
  std::string type;     ///< "hash:ip,port", "bitmap:port", ...
  std::string family;   ///< "inet" / "inet6"; not used by bitmap:port
  std::string comment;  ///< upstream's, used in the iptables rules that match the set
  /// `create NAME TYPE family inet hashsize 1024 maxelem 65536`, or `create NAME bitmap:port
  /// range 0-65535`, as upstream creates it.
  std::string createText() const;
  bool operator==(const IpsetDefinition&) const = default;
};
IpsetDefinition setDefinition(SetId set, net::Family family);

struct IpsetEntry {
  std::string set;    ///< the set's name
  std::string entry;  ///< "10.96.0.10,tcp:80", "10.0.0.5,tcp:80,10.0.0.5", "30080"
  std::string text() const { return "add " + set + " " + entry; }
  bool operator==(const IpsetEntry&) const = default;
  auto operator<=>(const IpsetEntry&) const = default;
};

// ---------------------------------------------------------------------------------------
// iptables

// The rule types are iptables mode's: IPVS mode's iptables part is written and diffed by the
// iptables backend's pieces (kproxy/iptables/differ.h).
using iptables::JumpRule;
using iptables::Table;
using iptables::tableName;

/// A rule a service port adds to one of the fixed chains, between the chain's fixed head and
/// tail (GlobalChain). Rules of different ports match different packets; a port's own rules
/// keep their order.
struct PortRule {
  Table table = Table::kNat;
  std::string chain;
  std::string spec;  ///< as iptables-save prints it, after "-A CHAIN "
  bool operator==(const PortRule&) const = default;
};

/// One of upstream IPVS mode's chains: the fixed rules before and after the ports' rules.
struct GlobalChain {
  Table table = Table::kNat;
  std::string name;
  std::vector<std::string> head;
  std::vector<std::string> tail;
  bool operator==(const GlobalChain&) const = default;
};

/// What one service port of one family owns. The ports of one service share their ClusterIP:
/// its bound address and KUBE-IPVS-IPS entry come with each of them, so a backend counts
/// references before it unbinds an address or deletes an entry.
struct Fragment {
  net::Family family = net::Family::kIPv4;
  std::string key;
  std::vector<PlannedVirtualServer> virtualServers;
  /// Addresses to bind to kube-ipvs0 (each once).
  std::vector<std::string> boundAddresses;
  /// Sorted, each once.
  std::vector<IpsetEntry> ipsetEntries;
  std::vector<PortRule> rules;
  std::vector<std::string> problems;  ///< what could not be rendered as the plan asks (logged)
  std::vector<iptables::RuleTag> tags;  ///< its rules that drop, and why (for the tracer)
};

/// The fixed objects of one family.
struct GlobalObjects {
  net::Family family = net::Family::kIPv4;
  std::vector<GlobalChain> chains;  ///< every chain kproxy owns in IPVS mode
  std::vector<JumpRule> jumps;
  std::vector<IpsetDefinition> sets;
  std::vector<iptables::RuleTag> tags;  ///< its rules that drop, and why (for the tracer)
};

/// Whether `chain` of `table` is kproxy's in IPVS mode (upstream's iptablesChains; kubelet's
/// KUBE-FIREWALL and the iptables mode's chains are not).
bool isOwnedChain(Table table, std::string_view chain);

class IpvsRenderer {
 public:
  explicit IpvsRenderer(RenderConfig config);

  /// The node the next renders are for: its pod CIDRs (NodeCIDR mode), its addresses (source
  /// ranges admitting the node, addresses not to bind), its NodePort addresses.
  void setNode(const sdk::NodeInfo& node);
  /// The addresses kube-ipvs0 holds now. They are not node addresses (upstream's
  /// GetAllLocalAddressesExcept): NodePorts do not answer on them and an externalIP among them
  /// is still bound. A backend whose host lists every interface's addresses must pass them.
  void setDummyInterfaceAddresses(std::vector<std::string> addresses);
  /// The cluster's ServiceCIDRs: new connections to their addresses that no Service holds
  /// (not bound to kube-ipvs0, so not local) are dropped, as the plan says for every mode.
  void setServiceCIDRs(std::vector<sdk::ServiceCIDR> cidrs) { serviceCIDRs_ = std::move(cidrs); }

  Fragment renderServicePort(const sdk::ServicePort& port) const;
  GlobalObjects renderGlobal(net::Family family) const;

  /// Where NodePorts of `family` answer: one virtual server per address.
  const std::vector<std::string>& nodePortAddresses(net::Family family) const {
    return nodePortAddresses_[family == net::Family::kIPv6 ? 1 : 0];
  }
  const RenderConfig& config() const { return config_; }
  const plan::PlanConfig& planConfig() const { return planConfig_; }

 private:
  bool isNodeAddress(std::string_view ip) const;
  void resolveNodePortAddresses();

  RenderConfig config_;
  plan::PlanConfig planConfig_;
  sdk::NodeInfo node_;
  std::vector<std::string> dummyAddresses_;  ///< sorted, each once
  std::vector<sdk::ServiceCIDR> serviceCIDRs_;
  std::vector<std::string> nodePortAddresses_[2];
};

/// The iptables rules of `family` as one iptables-restore input (tables nat then filter, as
/// upstream writes them; every chain declared; the jumps first in their built-in chains).
std::string renderIptables(const IpvsRenderer& renderer, net::Family family, std::span<const sdk::ServicePort> ports);

/// The ipsets of `family` as one `ipset restore` input: every set's create line, then every
/// entry's add line, sorted.
std::string renderIpsets(const IpvsRenderer& renderer, net::Family family, std::span<const sdk::ServicePort> ports);

/// How toIpvsadm prints.
enum class IpvsadmStyle : std::uint8_t {
  kSave,  ///< `ipvsadm-save -n`: "-A -t 10.96.0.10:53 -s rr" / "-a -t ... -r ... -m -w 1"
  kList,  ///< `ipvsadm -Ln`: "TCP  10.96.0.10:53 rr" / "  -> 10.244.1.5:53  Masq  1  0  0"
};

/// The virtual and real servers, in the given order, as ipvsadm prints them (for --dry-run).
std::string toIpvsadm(std::span<const PlannedVirtualServer> servers, IpvsadmStyle style = IpvsadmStyle::kSave);

}  // namespace kproxy::ipvs
