#pragma once
/// The one catalogue of kernel object names that must match upstream kube-proxy's, so that
/// runbooks, debugging habits and leftover cleanup keep working: the nftables mode's hashed
/// chain names; the iptables and IPVS modes' `KUBE-*` chains (fixed ones per table, and per
/// service port / endpoint ones hashed exactly as pkg/proxy/iptables/proxier.go does); IPVS
/// mode's ipsets and its dummy interface `kube-ipvs0`; the nfacct objects of iptables mode's
/// metrics. Every backend and cli/ take these names
/// from here; nothing else spells them.
/// Thread-safety: pure functions and constants.

#include <array>
#include <cstddef>
#include <string>
#include <string_view>

namespace kproxy::backends {

/// The first `length` characters (at most 52) of the RFC 4648 base32 encoding (upper case, as
/// Go's base32.StdEncoding) of SHA-256(input).
std::string base32Sha256Prefix(std::string_view input, std::size_t length);

/// Upstream nftables' hashAndTruncate: "<8 base32 chars of sha256(name)>-<name>", cut to 240
/// characters ("..." at the end) so it stays under nft's name limit.
std::string nftablesHashAndTruncate(std::string_view name);

/// The prefix of every chain and ipset name of upstream's (and of kubelet's KUBE-FIREWALL,
/// KUBE-KUBELET-CANARY and KUBE-MARK-DROP, which are not kube-proxy's).
inline constexpr std::string_view kKubePrefix = "KUBE-";

/// IPVS mode's dummy interface: every service address is bound to it. Not a node address
/// (upstream's GetAllLocalAddressesExcept("kube-ipvs0")). A character array so that it serves
/// C interfaces (if_nametoindex) as well as strings.
inline constexpr char kIpvsDummyInterface[] = "kube-ipvs0";

/// Upstream's nfacct objects (pkg/proxy/metrics/metrics.go), counted into by iptables mode's
/// rules and read by the metrics: KUBE-FORWARD's drop of INVALID packets, and IPv4 NodePorts
/// reached on 127.0.0.0/8.
inline constexpr std::string_view kNfacctInvalidDropped = "ct_state_invalid_dropped_pkts";
inline constexpr std::string_view kNfacctLocalhostNodePorts = "localhost_nps_accepted_pkts";

/// Upstream's fixed chains: the iptables mode's (pkg/proxy/iptables/proxier.go) and the ones
/// only IPVS mode has (pkg/proxy/ipvs/proxier.go).
namespace iptables_chains {
inline constexpr std::string_view kServices = "KUBE-SERVICES";
inline constexpr std::string_view kExternalServices = "KUBE-EXTERNAL-SERVICES";
inline constexpr std::string_view kNodePorts = "KUBE-NODEPORTS";
inline constexpr std::string_view kPostrouting = "KUBE-POSTROUTING";
inline constexpr std::string_view kMarkMasq = "KUBE-MARK-MASQ";
inline constexpr std::string_view kProxyFirewall = "KUBE-PROXY-FIREWALL";
inline constexpr std::string_view kForward = "KUBE-FORWARD";
inline constexpr std::string_view kProxyCanary = "KUBE-PROXY-CANARY";

/// IPVS mode's own fixed chains.
inline constexpr std::string_view kNodePort = "KUBE-NODE-PORT";
inline constexpr std::string_view kLoadBalancer = "KUBE-LOAD-BALANCER";
inline constexpr std::string_view kSourceRangesFirewall = "KUBE-SOURCE-RANGES-FIREWALL";
inline constexpr std::string_view kIpvsFilter = "KUBE-IPVS-FILTER";
inline constexpr std::string_view kIpvsOutFilter = "KUBE-IPVS-OUT-FILTER";
/// kproxy's, not upstream's: IPVS mode's ports of firewall-marked connections (ClientIP
/// affinity), changed to the endpoints' before IPVS.
inline constexpr std::string_view kIpvsFwmarkPorts = "KUBE-IPVS-FWMARK-PORTS";

/// Prefixes of the per service port and per endpoint chains (upstream's isServiceChainName).
inline constexpr std::string_view kClusterPolicyPrefix = "KUBE-SVC-";
inline constexpr std::string_view kLocalPolicyPrefix = "KUBE-SVL-";
inline constexpr std::string_view kExternalPrefix = "KUBE-EXT-";
inline constexpr std::string_view kFirewallPrefix = "KUBE-FW-";
inline constexpr std::string_view kEndpointPrefix = "KUBE-SEP-";
/// The Local traffic policy chains of kube-proxy before 1.24; only leftover cleanup knows them.
inline constexpr std::string_view kLegacyLocalPrefix = "KUBE-XLB-";

/// What upstream's CleanupLeftovers (iptables and IPVS modes) removes, per table: the fixed
/// chains of both modes, and in nat the per-service chains by prefix. Not here on purpose:
/// KUBE-FIREWALL, KUBE-KUBELET-CANARY and KUBE-MARK-DROP belong to kubelet.
inline constexpr std::array kNatLeftovers = {kServices,    kNodePorts, kPostrouting, kMarkMasq,
                                             kProxyCanary, kNodePort,  kLoadBalancer};
inline constexpr std::array kFilterLeftovers = {kServices,  kExternalServices,     kForward,
                                                kNodePorts, kProxyFirewall,        kProxyCanary,
                                                kNodePort,  kSourceRangesFirewall, kIpvsFilter,
                                                kIpvsOutFilter};
inline constexpr std::array kMangleLeftovers = {kProxyCanary};
inline constexpr std::array kNatLeftoverPrefixes = {kClusterPolicyPrefix, kLocalPolicyPrefix, kExternalPrefix,
                                                    kFirewallPrefix,      kEndpointPrefix,    kLegacyLocalPrefix};
}  // namespace iptables_chains

/// IPVS mode's ipsets (upstream's ipsetInfo, pkg/proxy/ipvs/ipset.go), as named for IPv4.
namespace ipsets {
inline constexpr std::string_view kLoopBack = "KUBE-LOOP-BACK";
inline constexpr std::string_view kClusterIP = "KUBE-CLUSTER-IP";
inline constexpr std::string_view kExternalIP = "KUBE-EXTERNAL-IP";
inline constexpr std::string_view kExternalIPLocal = "KUBE-EXTERNAL-IP-LOCAL";
inline constexpr std::string_view kLoadBalancer = "KUBE-LOAD-BALANCER";
inline constexpr std::string_view kLoadBalancerFW = "KUBE-LOAD-BALANCER-FW";
inline constexpr std::string_view kLoadBalancerLocal = "KUBE-LOAD-BALANCER-LOCAL";
inline constexpr std::string_view kLoadBalancerSourceIP = "KUBE-LOAD-BALANCER-SOURCE-IP";
inline constexpr std::string_view kLoadBalancerSourceCIDR = "KUBE-LOAD-BALANCER-SOURCE-CIDR";
inline constexpr std::string_view kNodePortTCP = "KUBE-NODE-PORT-TCP";
inline constexpr std::string_view kNodePortLocalTCP = "KUBE-NODE-PORT-LOCAL-TCP";
inline constexpr std::string_view kNodePortUDP = "KUBE-NODE-PORT-UDP";
inline constexpr std::string_view kNodePortLocalUDP = "KUBE-NODE-PORT-LOCAL-UDP";
inline constexpr std::string_view kNodePortSCTP = "KUBE-NODE-PORT-SCTP-HASH";
inline constexpr std::string_view kNodePortLocalSCTP = "KUBE-NODE-PORT-LOCAL-SCTP-HASH";
inline constexpr std::string_view kHealthCheckNodePort = "KUBE-HEALTH-CHECK-NODE-PORT";
inline constexpr std::string_view kIPVSIPs = "KUBE-IPVS-IPS";
/// Upstream's dual-stack naming: an IPv6 set's name has this prefix in place of kKubePrefix,
/// cut to ipset's kMaxNameLength characters ("KUBE-6-LOAD-BALANCER-SOURCE-CID").
inline constexpr std::string_view kIPv6Prefix = "KUBE-6-";
inline constexpr std::size_t kMaxNameLength = 31;
}  // namespace ipsets

/// Upstream's ServicePortName.String(): "ns/name:port", or "ns/name" for an unnamed port. This is
/// the string the iptables chain names hash.
std::string servicePortNameString(std::string_view ns, std::string_view name, std::string_view portName);

/// Upstream's endpoint string (net.JoinHostPort): "10.0.0.1:80", "[fd00::1]:80".
std::string endpointHostPort(std::string_view ip, int port);

/// Upstream's portProtoHash: 16 base32 characters of sha256(servicePortName + protocol).
/// `protocol` is lower case as upstream passes it ("tcp", "udp", "sctp").
std::string portProtoHash(std::string_view servicePortName, std::string_view protocol);

/// KUBE-SVC-<hash>: the service port's chain for cluster traffic policy.
std::string servicePortPolicyClusterChain(std::string_view servicePortName, std::string_view protocol);
/// KUBE-SVL-<hash>: the service port's chain for local traffic policy.
std::string servicePortPolicyLocalChain(std::string_view servicePortName, std::string_view protocol);
/// KUBE-EXT-<hash>: external traffic (NodePorts, external and load balancer IPs).
std::string serviceExternalChain(std::string_view servicePortName, std::string_view protocol);
/// KUBE-FW-<hash>: the load balancer source-range firewall.
std::string serviceFirewallChain(std::string_view servicePortName, std::string_view protocol);
/// KUBE-SEP-<16 base32 chars of sha256(servicePortName + protocol + endpoint)>, `endpoint` as
/// endpointHostPort() writes it.
std::string servicePortEndpointChain(std::string_view servicePortName, std::string_view protocol,
                                     std::string_view endpoint);

/// Whether `chain` is a per service port or per endpoint chain (KUBE-SVC-, -SVL-, -EXT-, -FW-,
/// -SEP-), as upstream's isServiceChainName.
bool isServiceChainName(std::string_view chain);

}  // namespace kproxy::backends
