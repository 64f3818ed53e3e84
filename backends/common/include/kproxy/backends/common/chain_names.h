#pragma once
/// Kernel object names that must match upstream kube-proxy's, so that runbooks, debugging habits
/// and leftover cleanup keep working: the nftables mode's hashed chain names and the iptables
/// mode's `KUBE-*` chains (fixed ones, and per service port / endpoint ones hashed exactly as
/// pkg/proxy/iptables/proxier.go does).
/// Thread-safety: pure functions and constants.

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

/// Upstream iptables' fixed chains.
namespace iptables_chains {
inline constexpr std::string_view kServices = "KUBE-SERVICES";
inline constexpr std::string_view kExternalServices = "KUBE-EXTERNAL-SERVICES";
inline constexpr std::string_view kNodePorts = "KUBE-NODEPORTS";
inline constexpr std::string_view kPostrouting = "KUBE-POSTROUTING";
inline constexpr std::string_view kMarkMasq = "KUBE-MARK-MASQ";
inline constexpr std::string_view kProxyFirewall = "KUBE-PROXY-FIREWALL";
inline constexpr std::string_view kForward = "KUBE-FORWARD";
inline constexpr std::string_view kProxyCanary = "KUBE-PROXY-CANARY";

/// Prefixes of the per service port and per endpoint chains (upstream's isServiceChainName).
inline constexpr std::string_view kClusterPolicyPrefix = "KUBE-SVC-";
inline constexpr std::string_view kLocalPolicyPrefix = "KUBE-SVL-";
inline constexpr std::string_view kExternalPrefix = "KUBE-EXT-";
inline constexpr std::string_view kFirewallPrefix = "KUBE-FW-";
inline constexpr std::string_view kEndpointPrefix = "KUBE-SEP-";
}  // namespace iptables_chains

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
