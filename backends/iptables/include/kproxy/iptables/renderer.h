#pragma once
/// IptablesRenderer: sdk service ports → the iptables rules kproxy wants, in upstream kube-proxy's
/// layout and names (pkg/proxy/iptables/proxier.go), decided by the shared service plan.
///
/// Per service port (nat table): KUBE-SVC-<hash> balances the cluster pool over KUBE-SEP-<hash>
/// endpoint chains with `-m statistic --mode random --probability` (upstream's precision),
/// KUBE-SVL-<hash> the local pool, KUBE-EXT-<hash> external traffic (masquerade, the eTP=Local
/// short-circuit), KUBE-FW-<hash> loadBalancerSourceRanges; session affinity is `-m recent`.
/// Its dispatch rules go to the shared chains: nat KUBE-SERVICES / KUBE-NODEPORTS capture its
/// addresses; filter KUBE-SERVICES / KUBE-EXTERNAL-SERVICES reject or drop what has no
/// endpoints, filter KUBE-PROXY-FIREWALL drops what the source-range firewall did not DNAT,
/// filter KUBE-NODEPORTS accepts the health-check node port. Dispatch rules of different
/// service ports match different packets, so their order does not matter; a dispatch chain is
/// made of sections (per service port, per ClusterIP, fixed tail) whose order does.
///
/// Every rule is rendered exactly as `iptables-save` prints it back (address prefixes, option
/// order, quoted comments, the kernel's rounding of probabilities), for iptables-nft and
/// iptables-legacy alike, so a read-back compares as text.
///
/// Where this differs from upstream's iptables mode, and why: docs/upstream-differences.md.
///
/// Thread-safety: pure functions of their inputs.

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kproxy/plan/options.h"
#include "kproxy/plan/service_plan.h"
#include "kproxy/plan/trace.h"
#include "kproxy/plugin/sdk.h"

namespace kproxy::iptables {

enum class Table : std::uint8_t { kFilter, kNat, kMangle };
inline constexpr Table kTables[] = {Table::kFilter, Table::kNat, Table::kMangle};
std::string_view tableName(Table table);  ///< "filter", "nat", "mangle"
std::optional<Table> tableNamed(std::string_view name);  ///< tableName's inverse; nullopt for another table

/// Settings that shape the ruleset, parsed from the plugin's options.
struct RenderConfig {
  /// The options every backend reads alike (detect-local-mode and its CIDRs or interface,
  /// masquerade-all and the masquerade bit, nodeport-addresses, node-ips), parsed once by the
  /// plan (plan/options.h) and carried whole.
  plan::CommonOptions common;
  /// --iptables-localhost-nodeports: IPv4 NodePorts answer on 127.0.0.0/8 (route_localnet).
  bool localhostNodePorts = true;
  /// MASQUERADE --random-fully (when the iptables tool and kernel support it).
  bool randomFully = true;
  /// Whether conntrack accepts out-of-window TCP (nf_conntrack_tcp_be_liberal): upstream then
  /// leaves out KUBE-FORWARD's drop of INVALID packets.
  bool conntrackTCPLiberal = false;
  /// Above this many endpoints in total, per-endpoint rules carry no comment (upstream's
  /// largeClusterEndpointsThreshold).
  std::size_t largeClusterEndpoints = 1000;

  std::uint32_t mark() const { return 1u << common.masqueradeBit; }
  /// "0x4000".
  std::string markHex() const;
};

/// Builds a RenderConfig from plugin options; an error names the bad option.
sdk::Expected<RenderConfig> parseRenderConfig(const sdk::Options& options);

/// One chain's rules, each the text after "-A CHAIN " as iptables-save prints it.
struct ChainRules {
  Table table = Table::kNat;
  std::string name;
  std::vector<std::string> rules;
  bool operator==(const ChainRules&) const = default;
};

/// Sections of a dispatch chain, in chain order.
enum class Section : std::uint8_t {
  kServicePort = 0,  ///< a service port's own address/port (order among them does not matter)
  kClusterIP = 1,    ///< per ClusterIP, after every port rule (its unused ports)
  kTail = 2,         ///< fixed rules at the end (NodePorts jump, ServiceCIDR drops)
};
inline constexpr std::size_t kSections = 3;

/// A rule in one of the shared dispatch chains.
struct DispatchRule {
  Table table = Table::kNat;
  std::string chain;
  Section section = Section::kServicePort;
  std::string spec;  ///< as iptables-save prints it, after "-A CHAIN "
  bool operator==(const DispatchRule&) const = default;
  auto operator<=>(const DispatchRule&) const = default;
};

/// A jump from a built-in chain (PREROUTING, INPUT, ...) to one of kproxy's, inserted first in
/// the built-in chain when missing; nothing else in a built-in chain is touched.
struct JumpRule {
  Table table = Table::kNat;
  std::string chain;  ///< the built-in chain
  std::string spec;
  bool operator==(const JumpRule&) const = default;
};

/// A rule the renderer tagged with why it drops or rejects, named by its identity in the
/// ruleset: table, chain and the rule as iptables-save prints it. Tags never reach the kernel;
/// the tracer reports them (IptablesTracer::tagRules), and explain reads them, never the rule.
struct RuleTag {
  Table table = Table::kFilter;
  std::string chain;
  std::string spec;
  plan::DropReason reason = plan::DropReason::kNone;
  bool operator==(const RuleTag&) const = default;
};

/// What one service port of one family owns.
struct Fragment {
  net::Family family = net::Family::kIPv4;
  std::string key;
  std::vector<ChainRules> chains;  ///< nat KUBE-SVC-/SVL-/EXT-/FW-/SEP- chains
  std::vector<DispatchRule> dispatch;
  std::vector<std::string> problems;  ///< what could not be rendered as asked (logged)
  std::size_t endpointChains = 0;
  /// The xt_recent lists its rules name (session affinity: one per endpoint of each pool).
  std::size_t recentLists = 0;
  std::vector<RuleTag> tags;  ///< its rules that drop or reject, and why
};

/// The fixed objects of one family.
struct GlobalObjects {
  net::Family family = net::Family::kIPv4;
  /// Chains whose whole content is fixed: KUBE-POSTROUTING, KUBE-MARK-MASQ, KUBE-FORWARD and
  /// the KUBE-PROXY-CANARY chains (empty), in filter, nat and mangle.
  std::vector<ChainRules> chains;
  /// The shared dispatch chains (declared even when empty), by table.
  std::vector<std::pair<Table, std::string>> dispatchChains;
  /// Their fixed rules (sections kTail).
  std::vector<DispatchRule> dispatch;
  std::vector<JumpRule> jumps;
  std::vector<RuleTag> tags;  ///< its rules that drop or reject, and why
};

/// The dispatch chains every family has: filter KUBE-SERVICES, KUBE-EXTERNAL-SERVICES,
/// KUBE-NODEPORTS, KUBE-PROXY-FIREWALL; nat KUBE-SERVICES, KUBE-NODEPORTS.
std::span<const std::pair<Table, std::string_view>> dispatchChainNames();

/// Whether a chain of `table` is kproxy's in iptables mode (so a full sync may rewrite or delete
/// it): the fixed chains, and in nat the per service port / endpoint chains.
bool isOwnedChain(Table table, std::string_view chain);

/// `-m statistic --probability` as iptables-save prints what upstream writes for 1/n: upstream
/// formats 1/n with ten decimals, the kernel keeps it as a 31-bit fraction, save prints eleven.
std::string probabilityText(std::size_t n);

/// Which of upstream's nfacct objects (backends::kNfacctInvalidDropped,
/// kNfacctLocalhostNodePorts) exist for the rules to count into (`-m nfacct --nfacct-name
/// NAME`): upstream matches one only when it exists, and leaves the match out otherwise.
struct NfacctObjects {
  bool invalidDropped = false;      ///< KUBE-FORWARD's drop of INVALID packets
  bool localhostNodePorts = false;  ///< IPv4 NodePorts reached on 127.0.0.0/8
  bool operator==(const NfacctObjects&) const = default;
};

class IptablesRenderer {
 public:
  explicit IptablesRenderer(RenderConfig config);

  /// The nfacct objects the next renders may count into (none until set).
  void setNfacct(NfacctObjects objects) { nfacct_ = objects; }
  const NfacctObjects& nfacct() const { return nfacct_; }

  /// The node the next renders are for (its pod CIDRs in NodeCIDR mode, its addresses for
  /// source ranges that admit the node, its NodePort addresses).
  void setNode(const sdk::NodeInfo& node);
  /// The cluster's service CIDRs (both families): unallocated ClusterIPs in them are dropped.
  void setServiceCIDRs(std::vector<sdk::ServiceCIDR> cidrs) { serviceCIDRs_ = std::move(cidrs); }
  /// Leave comments out of per-endpoint rules (more endpoints than largeClusterEndpoints).
  void setLargeCluster(bool large) { largeCluster_ = large; }
  bool largeCluster() const { return largeCluster_; }

  Fragment renderServicePort(const sdk::ServicePort& port) const;
  GlobalObjects renderGlobal(net::Family family, const sdk::NodeInfo& node) const;

  const RenderConfig& config() const { return config_; }
  const plan::PlanConfig& planConfig() const { return planConfig_; }
  /// Whether IPv4 NodePorts answer on 127.0.0.0/8 (--iptables-localhost-nodeports and NodePort
  /// addresses that hold loopback, after setNode): route_localnet and its guard rule are needed.
  bool localhostNodePorts() const;

 private:
  /// `-s CIDR` / `-i IF` conditions that tell this node's pods' traffic (negate: not from pods);
  /// empty when the detector cannot tell for `family`.
  std::string podSource(net::Family family, bool negate) const;

  /// Where NodePorts of one family answer: every local address (`-m addrtype --dst-type
  /// LOCAL`), or these addresses.
  struct NodePorts {
    bool allLocal = true;
    std::vector<std::string> addresses;
  };
  const NodePorts& nodePortsOf(net::Family family) const { return nodePorts_[family == net::Family::kIPv6 ? 1 : 0]; }

  RenderConfig config_;
  plan::PlanConfig planConfig_;
  std::vector<sdk::ServiceCIDR> serviceCIDRs_;
  bool largeCluster_ = false;
  NodePorts nodePorts_[2];
  NfacctObjects nfacct_;
};

/// Everything the renderer wants for `family`, as one iptables-restore input (tables filter,
/// nat, mangle; every chain declared; each dispatch chain's rules in section order; the jumps
/// first in their built-in chains). It loads into an empty ruleset, and parseIptablesSave reads
/// it (the tracer and `kproxy explain` work on it).
std::string renderRuleset(const IptablesRenderer& renderer, net::Family family,
                          std::span<const sdk::ServicePort> ports, const sdk::NodeInfo& node);

/// renderRuleset's text, and the tags of its rules that drop or reject (for the tracer).
struct TaggedRuleset {
  std::string text;
  std::vector<RuleTag> tags;
};
TaggedRuleset renderTaggedRuleset(const IptablesRenderer& renderer, net::Family family,
                                  std::span<const sdk::ServicePort> ports, const sdk::NodeInfo& node);

}  // namespace kproxy::iptables
