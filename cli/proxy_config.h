#pragma once
/// kproxy's effective configuration: the fields of kube-proxy's KubeProxyConfiguration
/// (kubeproxy.config.k8s.io/v1alpha1) with upstream's names and defaults, plus kproxy's own
/// process options. A plain value type; copy it freely.
///
/// Defaults follow upstream pkg/proxy/apis/config/v1alpha1/defaults.go and
/// cmd/kube-proxy/app/server_linux.go (platformApplyDefaults): an empty mode is "iptables", as
/// upstream's on Linux, and only nftables mode defaults an empty nodePortAddresses to
/// ["primary"].

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "duration.h"

namespace kproxy::cli {

inline constexpr const char* kApiVersion = "kubeproxy.config.k8s.io/v1alpha1";
inline constexpr const char* kKind = "KubeProxyConfiguration";
inline constexpr const char* kDefaultProxyMode = "iptables";
inline constexpr std::int32_t kProxyHealthzPort = 10256;
inline constexpr std::int32_t kProxyMetricsPort = 10249;

struct IPTablesConfig {
  std::int32_t masqueradeBit = 14;
  bool localhostNodePorts = true;
  bool snatNodeInternalIP = false;
  Duration syncPeriod = std::chrono::seconds(30);
  Duration minSyncPeriod = std::chrono::seconds(1);
  bool operator==(const IPTablesConfig&) const = default;
};

struct NFTablesConfig {
  std::int32_t masqueradeBit = 14;
  Duration syncPeriod = std::chrono::seconds(30);
  Duration minSyncPeriod = std::chrono::seconds(1);
  bool operator==(const NFTablesConfig&) const = default;
};

struct IPVSConfig {
  Duration syncPeriod = std::chrono::seconds(30);
  Duration minSyncPeriod{0};  ///< upstream leaves it unset (0: sync on every change)
  std::string scheduler;      ///< "" means the kernel default (rr)
  std::vector<std::string> excludeCIDRs;
  bool strictARP = false;
  Duration tcpTimeout{0};  ///< 0 leaves the system value
  Duration tcpFinTimeout{0};
  Duration udpTimeout{0};
  bool operator==(const IPVSConfig&) const = default;
};

struct ConntrackConfig {
  std::int32_t maxPerCore = 32 * 1024;  ///< 0 leaves nf_conntrack_max as is and ignores min
  std::int32_t min = 128 * 1024;
  Duration tcpEstablishedTimeout = std::chrono::hours(24);
  Duration tcpCloseWaitTimeout = std::chrono::hours(1);
  bool tcpBeLiberal = false;
  Duration udpTimeout{0};  ///< 0 leaves the system value
  Duration udpStreamTimeout{0};
  bool operator==(const ConntrackConfig&) const = default;
};

struct ClientConnectionConfig {
  std::string kubeconfig;
  std::string acceptContentTypes;
  /// Upstream's default. kproxy's API client speaks JSON whatever this says.
  std::string contentType = "application/vnd.kubernetes.protobuf";
  float qps = 5.0f;
  std::int32_t burst = 10;
  bool operator==(const ClientConnectionConfig&) const = default;
};

struct DetectLocalConfig {
  std::string bridgeInterface;
  std::string interfaceNamePrefix;
  bool operator==(const DetectLocalConfig&) const = default;
};

/// logsapi's LoggingConfiguration (component-base): what the logging flags set.
struct LoggingConfig {
  std::uint32_t verbosity = 0;  ///< klog's -v
  std::string format = "text";
  Duration flushFrequency = std::chrono::seconds(5);
  /// --vmodule's items as given, "pattern=N" each (upstream: text format only).
  std::vector<std::string> vmodule;
  /// The [Alpha] output routing options (upstream's feature gate LoggingAlphaOptions).
  bool textSplitStream = false;
  std::int64_t textInfoBufferSize = 0;  ///< bytes
  bool jsonSplitStream = false;
  std::int64_t jsonInfoBufferSize = 0;  ///< bytes
  bool operator==(const LoggingConfig&) const = default;
};

/// The userspace mode's proxy (kproxy's own process options; plugins/README.md, "userspace-*").
struct UserspaceConfig {
  /// --udp-timeout: a UDP flow with no datagram for this long ends (upstream's userspace
  /// default, 250ms).
  Duration udpIdleTimeout = std::chrono::milliseconds(250);
  Duration connectTimeout = std::chrono::milliseconds(250);  ///< per endpoint attempt
  std::int32_t connectAttempts = 4;                          ///< endpoints a connection tries
  std::int32_t maxConnections = 10000;                       ///< TCP connections at once
  Duration idleTimeout{0};                                   ///< TCP idle close; 0: never
  Duration endpointGrace = std::chrono::seconds(30);         ///< then connections to a removed endpoint close
  bool operator==(const UserspaceConfig&) const = default;
};

/// ebpf mode's attachment and pins (kproxy's own process options; plugins/README.md, "ebpf-*").
struct EbpfConfig {
  std::string cgroupPath;                       ///< empty: the root of the cgroup v2 hierarchy
  std::string pinPath = "/sys/fs/bpf/kproxy";  ///< on a bpffs mount
  std::string netnsDir;                         ///< pods' namespace files; empty: none
  bool operator==(const EbpfConfig&) const = default;
};

struct ProxyConfig {
  // --- KubeProxyConfiguration (what --config reads, --write-config-to and /configz write) ---
  std::string mode = kDefaultProxyMode;
  std::string bindAddress = "0.0.0.0";
  std::string healthzBindAddress = "0.0.0.0:10256";  ///< empty disables the server
  std::string metricsBindAddress = "127.0.0.1:10249";  ///< empty disables the server
  bool bindAddressHardFail = false;
  bool enableProfiling = false;
  std::string showHiddenMetricsForVersion;
  std::string clusterCIDR;  ///< one CIDR or a comma-separated dual-stack pair
  std::string hostnameOverride;
  /// Upstream's internal config keeps one masqueradeAll; the v1alpha1 file holds it as
  /// iptables.masqueradeAll (nftables.masqueradeAll in nftables mode). toYaml writes both.
  bool masqueradeAll = false;
  /// CIDRs, or keywords: "primary" (alone), "all", "localhost". Empty: all local IPs (the
  /// default of iptables, IPVS and userspace modes), except in nftables mode where
  /// applyPlatformDefaults() makes it ["primary"] as upstream does.
  std::vector<std::string> nodePortAddresses;
  IPTablesConfig iptables;
  NFTablesConfig nftables;
  IPVSConfig ipvs;
  ConntrackConfig conntrack;
  ClientConnectionConfig clientConnection;
  std::string detectLocalMode;  ///< "" becomes ClusterCIDR in applyPlatformDefaults()
  DetectLocalConfig detectLocal;
  std::int32_t oomScoreAdj = -999;
  Duration configSyncPeriod = std::chrono::minutes(15);
  std::string portRange;  ///< unused upstream since the userspace proxy went away
  std::map<std::string, bool> featureGates;
  LoggingConfig logging;

  // --- kproxy's own process options (command line only; never in the file) ---
  std::string master;         ///< --master: API server URL, overrides the kubeconfig's
  std::string manifestsDir;   ///< --manifests: read objects from files instead of an API server
  bool allowHttpCredentials = false;  ///< --insecure-allow-http-credentials: token/password over http://
  std::vector<std::string> pluginDirs;  ///< --plugin-dir, repeatable, in the given order
  bool dryRun = false;        ///< --dry-run: print planned kernel operations, change nothing
  std::string iptablesVariant = "auto";  ///< --iptables-variant: auto, nft or legacy (kproxy's own)
  /// --verify-period (kproxy's own): how often the kernel is checked against the plan (and
  /// repaired); 0 disables it.
  Duration verifyPeriod = std::chrono::minutes(5);
  UserspaceConfig userspace;  ///< --udp-timeout, --userspace-*
  EbpfConfig ebpf;            ///< --ebpf-*
  bool cleanup = false;       ///< --cleanup: remove kproxy's kernel state and exit
  bool initOnly = false;      ///< --init-only
  bool showHelp = false;      ///< -h/--help
  bool showVersion = false;   ///< --version

  bool operator==(const ProxyConfig&) const = default;

  /// The sync periods of the section the selected mode uses (ipvs for "ipvs", nftables for
  /// "nftables", iptables otherwise), as upstream's v1alpha1 conversion picks them.
  Duration effectiveSyncPeriod() const;
  Duration effectiveMinSyncPeriod() const;
};

/// Fills what upstream fills after loading (server_linux.go platformApplyDefaults): an empty
/// mode becomes kDefaultProxyMode, an empty detectLocalMode becomes "ClusterCIDR", and in
/// nftables mode an empty nodePortAddresses becomes ["primary"]. Idempotent.
void applyPlatformDefaults(ProxyConfig& config);

/// "host" -> "host:port" when `address` has no port (upstream proxyutil.AppendPortIfNeeded);
/// IPv6 literals get brackets. Empty and non-IP strings are returned unchanged.
std::string appendPortIfNeeded(const std::string& address, std::int32_t port);

}  // namespace kproxy::cli
