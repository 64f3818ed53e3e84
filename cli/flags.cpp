#include "flags.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <functional>
#include <limits>
#include <optional>

#include "config_file.h"
#include "net_util.h"

namespace kproxy::cli {
namespace {

using core::ErrorCategory;
using core::makeError;

enum class Kind { kBool, kString, kInt32, kFloat, kDuration, kStringList, kFeatureGates, kLevel, kQuantity };

// What a flag configures, which decides whether --config overrides it.
enum class Scope {
  kConfig,   ///< a KubeProxyConfiguration field: ignored when --config is given
  kLogging,  ///< a logging field: overrides the file (upstream copyLogsFromFlags)
  kProcess,  ///< not in the file: always applies
};

// Applies a flag's value; returns the reason when the value is rejected.
using Setter = std::function<std::optional<std::string>(ParsedFlags&, std::string_view)>;

struct FlagSpec {
  std::string_view name;
  char shorthand = 0;
  Kind kind = Kind::kString;
  Scope scope = Scope::kConfig;
  std::string_view defaultText;
  std::string_view help;
  Setter set;
  /// pflag's MarkDeprecated message: the flag still works, with a warning, and is left out of
  /// the help.
  std::string_view deprecated = {};
};

// strconv.ParseBool's spellings, which pflag uses.
std::optional<bool> parseBool(std::string_view s) {
  for (std::string_view t : {"1", "t", "T", "true", "TRUE", "True"}) {
    if (s == t) return true;
  }
  for (std::string_view f : {"0", "f", "F", "false", "FALSE", "False"}) {
    if (s == f) return false;
  }
  return std::nullopt;
}

std::optional<std::int32_t> parseInt32(std::string_view s) {
  if (!s.empty() && s.front() == '+') s.remove_prefix(1);
  std::int32_t value = 0;
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (s.empty() || ec != std::errc{} || ptr != s.data() + s.size()) return std::nullopt;
  return value;
}

std::vector<std::string> splitComma(std::string_view s) {
  std::vector<std::string> out;
  if (s.empty()) return out;
  std::size_t start = 0;
  while (true) {
    const auto comma = s.find(',', start);
    out.emplace_back(s.substr(start, comma - start));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return out;
}

template <typename Apply>
Setter boolSetter(Apply apply) {
  return [apply](ParsedFlags& f, std::string_view v) -> std::optional<std::string> {
    const auto b = parseBool(v);
    if (!b) return "must be true or false";
    apply(f, *b);
    return std::nullopt;
  };
}

template <typename Apply>
Setter stringSetter(Apply apply) {
  return [apply](ParsedFlags& f, std::string_view v) -> std::optional<std::string> {
    apply(f, std::string(v));
    return std::nullopt;
  };
}

template <typename Apply>
Setter int32Setter(Apply apply) {
  return [apply](ParsedFlags& f, std::string_view v) -> std::optional<std::string> {
    const auto n = parseInt32(v);
    if (!n) return "must be a 32-bit integer";
    apply(f.config, *n);
    return std::nullopt;
  };
}

template <typename Apply>
Setter durationSetter(Apply apply) {
  return [apply](ParsedFlags& f, std::string_view v) -> std::optional<std::string> {
    auto d = parseGoDuration(v);
    if (!d) return d.error().context + " (examples: 30s, 1m30s, 500ms, 2h)";
    apply(f.config, *d);
    return std::nullopt;
  };
}

template <typename Apply>
Setter listSetter(Apply apply) {
  return [apply](ParsedFlags& f, std::string_view v) -> std::optional<std::string> {
    for (auto& item : splitComma(v)) apply(f.config, std::move(item));
    return std::nullopt;
  };
}

// pflag's IPPortVar: an IP, or IP:port; empty disables the server. The text as given is kept
// too, for the deprecated port flags (effectiveConfig).
Setter hostPortSetter(std::string ProxyConfig::*field, std::string ParsedFlags::*given,
                      std::int32_t defaultPort) {
  return [field, given, defaultPort](ParsedFlags& f, std::string_view v) -> std::optional<std::string> {
    const std::string value(v);
    if (!value.empty() && !ipFamilyOf(value)) {
      const auto hp = splitHostPort(value);
      if (!hp || !ipFamilyOf(hp->host)) return "must be IP or IP:port";
    }
    f.*given = value;
    f.config.*field = appendPortIfNeeded(value, defaultPort);
    return std::nullopt;
  };
}

// resource.Quantity as logsapi's info buffer sizes take it: a non-negative integer with an
// optional decimal (k, M, G, T, P, E) or binary (Ki, Mi, Gi, Ti, Pi, Ei) suffix.
std::optional<std::int64_t> parseByteQuantity(std::string_view s) {
  static constexpr std::pair<std::string_view, std::int64_t> kSuffixes[] = {
      {"Ki", 1LL << 10}, {"Mi", 1LL << 20}, {"Gi", 1LL << 30}, {"Ti", 1LL << 40}, {"Pi", 1LL << 50},
      {"Ei", 1LL << 60}, {"k", 1000LL},     {"M", 1000000LL}, {"G", 1000000000LL},
      {"T", 1000000000000LL}, {"P", 1000000000000000LL}, {"E", 1000000000000000000LL}};
  std::int64_t multiplier = 1;
  for (const auto& [suffix, factor] : kSuffixes) {
    if (s.size() > suffix.size() && s.ends_with(suffix)) {
      s.remove_suffix(suffix.size());
      multiplier = factor;
      break;
    }
  }
  if (!s.empty() && s.front() == '+') s.remove_prefix(1);
  std::int64_t n = 0;
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), n);
  if (s.empty() || ec != std::errc{} || ptr != s.data() + s.size() || n < 0) return std::nullopt;
  if (n > std::numeric_limits<std::int64_t>::max() / multiplier) return std::nullopt;
  return n * multiplier;
}

Setter byteQuantitySetter(std::int64_t LoggingConfig::*field) {
  return [field](ParsedFlags& f, std::string_view v) -> std::optional<std::string> {
    const auto n = parseByteQuantity(v);
    if (!n) return "must be a quantity of bytes such as 512, 64Ki or 1M";
    f.config.logging.*field = *n;
    return std::nullopt;
  };
}

// The name as upstream's flag set reads it (cliflag.WordSepNormalizeFunc): `_` is `-`.
std::string normalizedName(std::string_view name) {
  std::string out(name);
  std::replace(out.begin(), out.end(), '_', '-');
  return out;
}

const std::vector<FlagSpec>& flagSpecs() {
  static const std::vector<FlagSpec> specs = [] {
    using C = ProxyConfig;
    std::vector<FlagSpec> s = {
        // --- process flags ---
        {"config", 0, Kind::kString, Scope::kProcess, "", "The path to the configuration file.",
         stringSetter([](ParsedFlags& f, std::string v) { f.configFile = std::move(v); })},
        {"write-config-to", 0, Kind::kString, Scope::kProcess, "",
         "If set, write the effective configuration to this file as YAML and exit.",
         stringSetter([](ParsedFlags& f, std::string v) { f.writeConfigTo = std::move(v); })},
        {"cleanup", 0, Kind::kBool, Scope::kProcess, "false",
         "If true, remove the kernel state kproxy created (all modes) and exit.",
         boolSetter([](ParsedFlags& f, bool b) { f.config.cleanup = b; })},
        {"init-only", 0, Kind::kBool, Scope::kProcess, "false",
         "If true, perform the initialization steps that need full root privileges, then exit.",
         boolSetter([](ParsedFlags& f, bool b) { f.config.initOnly = b; })},
        {"master", 0, Kind::kString, Scope::kProcess, "",
         "The address of the Kubernetes API server (overrides any value in kubeconfig).",
         stringSetter([](ParsedFlags& f, std::string v) { f.config.master = std::move(v); })},
        {"insecure-allow-http-credentials", 0, Kind::kBool, Scope::kProcess, "false",
         "If true, allow sending a bearer token or password to an http:// API server (--master or "
         "the kubeconfig's server), where anyone on the path can read it. Refused by default.",
         boolSetter([](ParsedFlags& f, bool b) { f.config.allowHttpCredentials = b; })},
        {"hostname-override", 0, Kind::kString, Scope::kProcess, "",
         "If non-empty, used as the name of the Node kproxy runs on instead of the hostname. "
         "Overrides the config file.",
         stringSetter([](ParsedFlags& f, std::string v) { f.config.hostnameOverride = std::move(v); })},
        {"manifests", 0, Kind::kString, Scope::kProcess, "",
         "Read Services, EndpointSlices and Nodes from the manifest files in this directory "
         "instead of an API server.",
         stringSetter([](ParsedFlags& f, std::string v) { f.config.manifestsDir = std::move(v); })},
        {"plugin-dir", 0, Kind::kString, Scope::kProcess, "built-in plugin directory",
         "A directory to load backend plugins from (repeatable; searched in order).",
         [](ParsedFlags& f, std::string_view v) -> std::optional<std::string> {
           if (v.empty()) return "must not be empty";
           f.config.pluginDirs.emplace_back(v);
           return std::nullopt;
         }},
        {"dry-run", 0, Kind::kBool, Scope::kProcess, "false",
         "Print the planned kernel operations and change nothing.",
         boolSetter([](ParsedFlags& f, bool b) { f.config.dryRun = b; })},
        {"udp-timeout", 0, Kind::kDuration, Scope::kProcess, "250ms",
         "userspace mode: how long an idle UDP flow is kept (> 0).",
         durationSetter([](C& c, Duration d) { c.userspace.udpIdleTimeout = d; })},
        {"userspace-connect-timeout", 0, Kind::kDuration, Scope::kProcess, "250ms",
         "userspace mode: how long one endpoint may take to accept a connection before the next is tried (> 0).",
         durationSetter([](C& c, Duration d) { c.userspace.connectTimeout = d; })},
        {"userspace-connect-attempts", 0, Kind::kInt32, Scope::kProcess, "4",
         "userspace mode: endpoints a connection tries at most (> 0).",
         int32Setter([](C& c, std::int32_t n) { c.userspace.connectAttempts = n; })},
        {"userspace-max-connections", 0, Kind::kInt32, Scope::kProcess, "10000",
         "userspace mode: TCP connections relayed at once; more are reset (> 0).",
         int32Setter([](C& c, std::int32_t n) { c.userspace.maxConnections = n; })},
        {"verify-period", 0, Kind::kDuration, Scope::kProcess, "5m0s",
         "How often the kernel state is read back and compared with the plan when nothing changed "
         "(and 10s after a full sync that changed it); differences are logged, counted and repaired. "
         "Where a verification takes long, they are further apart: at least 100 times the "
         "last one's duration. 0 disables it.",
         durationSetter([](C& c, Duration d) { c.verifyPeriod = d; })},
        {"ebpf-cgroup-path", 0, Kind::kString, Scope::kProcess, "",
         "ebpf mode: the cgroup v2 directory whose processes' sockets are load-balanced "
         "(empty: the root of the cgroup v2 hierarchy, wherever it is mounted).",
         stringSetter([](ParsedFlags& f, std::string v) { f.config.ebpf.cgroupPath = std::move(v); })},
        {"ebpf-netns-dir", 0, Kind::kString, Scope::kProcess, "",
         "ebpf mode: a directory of network namespace files (/var/run/netns, where containerd's "
         "and CRI-O's CNI setups bind-mount the pods' namespaces) whose connected UDP sockets are "
         "ended when their endpoint stops serving, beside those of the processes in "
         "--ebpf-cgroup-path that kproxy can see (all of them with the host's PID namespace). "
         "Empty: none.",
         stringSetter([](ParsedFlags& f, std::string v) { f.config.ebpf.netnsDir = std::move(v); })},
        {"ebpf-pin-path", 0, Kind::kString, Scope::kProcess, "/sys/fs/bpf/kproxy",
         "ebpf mode: the directory on a bpf filesystem where its maps and program links are pinned, "
         "so that a restart re-adopts them.",
         [](ParsedFlags& f, std::string_view v) -> std::optional<std::string> {
           if (v.empty()) return "must not be empty";
           f.config.ebpf.pinPath = std::string(v);
           return std::nullopt;
         }},
        {"userspace-idle-timeout", 0, Kind::kDuration, Scope::kProcess, "0s",
         "userspace mode: close a TCP connection idle this long (0: never).",
         durationSetter([](C& c, Duration d) { c.userspace.idleTimeout = d; })},
        {"userspace-endpoint-grace", 0, Kind::kDuration, Scope::kProcess, "30s",
         "userspace mode: how long connections to an endpoint that left its service are kept.",
         durationSetter([](C& c, Duration d) { c.userspace.endpointGrace = d; })},
        {"version", 0, Kind::kBool, Scope::kProcess, "false", "Print version information and exit.",
         boolSetter([](ParsedFlags& f, bool b) { f.config.showVersion = b; })},
        {"help", 'h', Kind::kBool, Scope::kProcess, "false", "Help for kproxy.",
         boolSetter([](ParsedFlags& f, bool b) { f.config.showHelp = b; })},
        // --- logging flags (override the config file) ---
        {"v", 'v', Kind::kLevel, Scope::kLogging, "0", "Number for the log level verbosity.",
         [](ParsedFlags& f, std::string_view v) -> std::optional<std::string> {
           const auto n = parseInt32(v);
           if (!n || *n < 0) return "must be a non-negative integer";
           f.config.logging.verbosity = static_cast<std::uint32_t>(*n);
           return std::nullopt;
         }},
        {"logging-format", 0, Kind::kString, Scope::kLogging, "text",
         "Sets the log format. Permitted formats: \"text\", \"json\".",
         stringSetter([](ParsedFlags& f, std::string v) { f.config.logging.format = std::move(v); })},
        {"vmodule", 0, Kind::kStringList, Scope::kLogging, "",
         "comma-separated list of pattern=N settings for file-filtered logging (only works for the "
         "default text log format).",
         // logsapi's VModuleConfigurationPflag.Set.
         [](ParsedFlags& f, std::string_view v) -> std::optional<std::string> {
           for (auto& item : splitComma(v)) {
             if (item.empty()) continue;
             const auto eq = item.find('=');
             if (eq == std::string::npos || eq == 0 || eq + 1 == item.size() ||
                 item.find('=', eq + 1) != std::string::npos)
               return fmt::format("\"{}\" does not have the pattern=N format", item);
             const auto level = parseInt32(std::string_view(item).substr(eq + 1));
             if (!level || *level < 0) return fmt::format("parsing verbosity in \"{}\": must be a non-negative integer", item);
             f.config.logging.vmodule.push_back(std::move(item));
           }
           return std::nullopt;
         }},
        {"log-flush-frequency", 0, Kind::kDuration, Scope::kLogging, "5s",
         "Maximum number of seconds between log flushes.",
         durationSetter([](C& c, Duration d) { c.logging.flushFrequency = d; })},
        {"log-text-split-stream", 0, Kind::kBool, Scope::kLogging, "false",
         "[Alpha] In text format, write error messages to stderr and info messages to stdout. "
         "Needs the LoggingAlphaOptions feature gate.",
         boolSetter([](ParsedFlags& f, bool b) { f.config.logging.textSplitStream = b; })},
        {"log-text-info-buffer-size", 0, Kind::kQuantity, Scope::kLogging, "0",
         "[Alpha] In text format with split output streams, how many bytes of info messages may be "
         "buffered (512, 1k, 2Ki, 3M, ...). Needs the LoggingAlphaOptions feature gate.",
         byteQuantitySetter(&LoggingConfig::textInfoBufferSize)},
        {"log-json-split-stream", 0, Kind::kBool, Scope::kLogging, "false",
         "[Alpha] In JSON format, write error messages to stderr and info messages to stdout. "
         "Needs the LoggingAlphaOptions feature gate.",
         boolSetter([](ParsedFlags& f, bool b) { f.config.logging.jsonSplitStream = b; })},
        {"log-json-info-buffer-size", 0, Kind::kQuantity, Scope::kLogging, "0",
         "[Alpha] In JSON format with split output streams, how many bytes of info messages may be "
         "buffered (512, 1k, 2Ki, 3M, ...). Needs the LoggingAlphaOptions feature gate.",
         byteQuantitySetter(&LoggingConfig::jsonInfoBufferSize)},
        // --- upstream's deprecated flags ---
        {"healthz-port", 0, Kind::kInt32, Scope::kConfig, "10256",
         "The port to bind the health check server. Use 0 to disable.",
         [](ParsedFlags& f, std::string_view v) -> std::optional<std::string> {
           const auto n = parseInt32(v);
           if (!n) return "must be a 32-bit integer";
           f.healthzPort = *n;
           return std::nullopt;
         },
         "This flag is deprecated and will be removed in a future release. Please use "
         "--healthz-bind-address instead."},
        {"metrics-port", 0, Kind::kInt32, Scope::kConfig, "10249",
         "The port to bind the metrics server. Use 0 to disable.",
         [](ParsedFlags& f, std::string_view v) -> std::optional<std::string> {
           const auto n = parseInt32(v);
           if (!n) return "must be a 32-bit integer";
           f.metricsPort = *n;
           return std::nullopt;
         },
         "This flag is deprecated and will be removed in a future release. Please use "
         "--metrics-bind-address instead."},
        // --- flags upstream's binary carries from cadvisor (its machine and boot IDs); kproxy
        // reads neither, so they are accepted and have no effect ---
        {"boot-id-file", 0, Kind::kString, Scope::kProcess, "/proc/sys/kernel/random/boot_id",
         "Accepted for kube-proxy compatibility; kproxy does not read a boot ID.",
         [](ParsedFlags&, std::string_view) -> std::optional<std::string> { return std::nullopt; }},
        {"machine-id-file", 0, Kind::kString, Scope::kProcess, "/etc/machine-id,/var/lib/dbus/machine-id",
         "Accepted for kube-proxy compatibility; kproxy does not read a machine ID.",
         [](ParsedFlags&, std::string_view) -> std::optional<std::string> { return std::nullopt; }},
        // --- KubeProxyConfiguration flags (ignored when --config is given) ---
        {"proxy-mode", 0, Kind::kString, Scope::kConfig, kDefaultProxyMode,
         "Which proxy mode (backend plugin) to use: iptables (the default, as upstream's on Linux; "
         "also when empty), nftables (recommended), ipvs, userspace or ebpf, or a third-party plugin's name.",
         stringSetter([](ParsedFlags& f, std::string v) { f.config.mode = std::move(v); })},
        {"kubeconfig", 0, Kind::kString, Scope::kConfig, "",
         "Path to kubeconfig file with authorization information (the master location can be "
         "overridden by the master flag).",
         stringSetter([](ParsedFlags& f, std::string v) {
           f.config.clientConnection.kubeconfig = std::move(v);
         })},
        {"kube-api-content-type", 0, Kind::kString, Scope::kConfig,
         "application/vnd.kubernetes.protobuf", "Content type of requests sent to apiserver.",
         stringSetter([](ParsedFlags& f, std::string v) {
           f.config.clientConnection.contentType = std::move(v);
         })},
        {"kube-api-qps", 0, Kind::kFloat, Scope::kConfig, "5",
         "QPS to use while talking with kubernetes apiserver.",
         [](ParsedFlags& f, std::string_view v) -> std::optional<std::string> {
           float q = 0;
           const auto [ptr, ec] = std::from_chars(v.data(), v.data() + v.size(), q);
           if (v.empty() || ec != std::errc{} || ptr != v.data() + v.size()) return "must be a number";
           f.config.clientConnection.qps = q;
           return std::nullopt;
         }},
        {"kube-api-burst", 0, Kind::kInt32, Scope::kConfig, "10",
         "Burst to use while talking with kubernetes apiserver.",
         int32Setter([](C& c, std::int32_t n) { c.clientConnection.burst = n; })},
        {"bind-address", 0, Kind::kString, Scope::kConfig, "0.0.0.0",
         "Overrides kproxy's idea of what its node's primary IP is.",
         [](ParsedFlags& f, std::string_view v) -> std::optional<std::string> {
           if (!ipFamilyOf(v)) return "must be an IP address";
           f.config.bindAddress = std::string(v);
           return std::nullopt;
         }},
        {"healthz-bind-address", 0, Kind::kString, Scope::kConfig, "0.0.0.0:10256",
         "The IP address and port for the health check server to serve on (empty disables it).",
         hostPortSetter(&C::healthzBindAddress, &ParsedFlags::healthzBindAddressGiven, kProxyHealthzPort)},
        {"metrics-bind-address", 0, Kind::kString, Scope::kConfig, "127.0.0.1:10249",
         "The IP address and port for the metrics server to serve on (empty disables it).",
         hostPortSetter(&C::metricsBindAddress, &ParsedFlags::metricsBindAddressGiven, kProxyMetricsPort)},
        {"bind-address-hard-fail", 0, Kind::kBool, Scope::kConfig, "false",
         "If true, treat failure to bind to a port as fatal and exit.",
         boolSetter([](ParsedFlags& f, bool b) { f.config.bindAddressHardFail = b; })},
        {"profiling", 0, Kind::kBool, Scope::kConfig, "false",
         "Upstream serves Go's /debug/pprof handlers with it; kproxy cannot, so true is refused "
         "at start-up (profile kproxy with perf instead).",
         boolSetter([](ParsedFlags& f, bool b) { f.config.enableProfiling = b; })},
        {"show-hidden-metrics-for-version", 0, Kind::kString, Scope::kConfig, "",
         "The previous version for which you want to show hidden metrics.",
         stringSetter([](ParsedFlags& f, std::string v) {
           f.config.showHiddenMetricsForVersion = std::move(v);
         })},
        {"cluster-cidr", 0, Kind::kString, Scope::kConfig, "",
         "The CIDR range of the pods in the cluster (a comma-separated dual-stack pair allowed).",
         stringSetter([](ParsedFlags& f, std::string v) { f.config.clusterCIDR = std::move(v); })},
        {"masquerade-all", 0, Kind::kBool, Scope::kConfig, "false",
         "SNAT all traffic sent via Service cluster IPs.",
         boolSetter([](ParsedFlags& f, bool b) { f.config.masqueradeAll = b; })},
        {"nodeport-addresses", 0, Kind::kStringList, Scope::kConfig, "[] (nftables: primary)",
         "Comma-separated CIDRs that contain valid node IPs, or the single string 'primary'. "
         "NodePorts are served only on the node's interface addresses in these ranges (or on its "
         "primary IP of each family); unset, on every local address.",
         listSetter([](C& c, std::string v) { c.nodePortAddresses.push_back(std::move(v)); })},
        {"iptables-masquerade-bit", 0, Kind::kInt32, Scope::kConfig, "14",
         "The bit of the fwmark space to mark packets requiring SNAT with; within [0, 31].",
         int32Setter([](C& c, std::int32_t n) {
           c.iptables.masqueradeBit = n;
           c.nftables.masqueradeBit = n;
         })},
        {"iptables-localhost-nodeports", 0, Kind::kBool, Scope::kConfig, "true",
         "If false, NodePort services cannot be reached via localhost (iptables mode, IPv4).",
         boolSetter([](ParsedFlags& f, bool b) { f.config.iptables.localhostNodePorts = b; })},
        // Upstream applies --iptables-sync-period to every mode but ipvs, so it sets the
        // nftables section too.
        {"iptables-variant", 0, Kind::kString, Scope::kProcess, "auto",
         "iptables mode: which iptables to program, \"nft\" (iptables-nft), \"legacy\" (iptables-legacy) or "
         "\"auto\" (the one already holding rules, as upstream's iptables wrapper; nft when neither does).",
         [](ParsedFlags& f, std::string_view v) -> std::optional<std::string> {
           if (v != "auto" && v != "nft" && v != "legacy") return "must be auto, nft or legacy";
           f.config.iptablesVariant = std::string(v);
           return std::nullopt;
         }},
        {"iptables-sync-period", 0, Kind::kDuration, Scope::kConfig, "30s",
         "How often rules are fully resynchronized (iptables and nftables modes); > 0.",
         durationSetter([](C& c, Duration d) { c.iptables.syncPeriod = c.nftables.syncPeriod = d; })},
        {"iptables-min-sync-period", 0, Kind::kDuration, Scope::kConfig, "1s",
         "The minimum period between rule resyncs (iptables and nftables modes); 0 syncs on "
         "every change.",
         durationSetter([](C& c, Duration d) {
           c.iptables.minSyncPeriod = c.nftables.minSyncPeriod = d;
         })},
        {"ipvs-sync-period", 0, Kind::kDuration, Scope::kConfig, "30s",
         "How often IPVS rules are fully resynchronized; > 0.",
         durationSetter([](C& c, Duration d) { c.ipvs.syncPeriod = d; })},
        {"ipvs-min-sync-period", 0, Kind::kDuration, Scope::kConfig, "0s",
         "The minimum period between IPVS rule resyncs; 0 syncs on every change.",
         durationSetter([](C& c, Duration d) { c.ipvs.minSyncPeriod = d; })},
        {"ipvs-scheduler", 0, Kind::kString, Scope::kConfig, "",
         "The IPVS scheduler (rr, wrr, lc, wlc, lblc, lblcr, sh, dh, sed, nq, mh).",
         stringSetter([](ParsedFlags& f, std::string v) { f.config.ipvs.scheduler = std::move(v); })},
        {"ipvs-exclude-cidrs", 0, Kind::kStringList, Scope::kConfig, "[]",
         "Comma-separated CIDRs the IPVS proxier must not touch when cleaning up.",
         listSetter([](C& c, std::string v) { c.ipvs.excludeCIDRs.push_back(std::move(v)); })},
        {"ipvs-strict-arp", 0, Kind::kBool, Scope::kConfig, "false",
         "Enable strict ARP (arp_ignore=1, arp_announce=2).",
         boolSetter([](ParsedFlags& f, bool b) { f.config.ipvs.strictARP = b; })},
        {"ipvs-tcp-timeout", 0, Kind::kDuration, Scope::kConfig, "0s",
         "The timeout for idle IPVS TCP connections, 0 to leave as-is.",
         durationSetter([](C& c, Duration d) { c.ipvs.tcpTimeout = d; })},
        {"ipvs-tcpfin-timeout", 0, Kind::kDuration, Scope::kConfig, "0s",
         "The timeout for IPVS TCP connections after a FIN, 0 to leave as-is.",
         durationSetter([](C& c, Duration d) { c.ipvs.tcpFinTimeout = d; })},
        {"ipvs-udp-timeout", 0, Kind::kDuration, Scope::kConfig, "0s",
         "The timeout for IPVS UDP packets, 0 to leave as-is.",
         durationSetter([](C& c, Duration d) { c.ipvs.udpTimeout = d; })},
        {"detect-local-mode", 0, Kind::kString, Scope::kConfig, "ClusterCIDR",
         "How to detect local traffic: ClusterCIDR, NodeCIDR, BridgeInterface, "
         "InterfaceNamePrefix.",
         stringSetter([](ParsedFlags& f, std::string v) { f.config.detectLocalMode = std::move(v); })},
        {"pod-bridge-interface", 0, Kind::kString, Scope::kConfig, "",
         "With --detect-local-mode=BridgeInterface: the bridge pod traffic comes from.",
         stringSetter([](ParsedFlags& f, std::string v) {
           f.config.detectLocal.bridgeInterface = std::move(v);
         })},
        {"pod-interface-name-prefix", 0, Kind::kString, Scope::kConfig, "",
         "With --detect-local-mode=InterfaceNamePrefix: the prefix of pod interfaces.",
         stringSetter([](ParsedFlags& f, std::string v) {
           f.config.detectLocal.interfaceNamePrefix = std::move(v);
         })},
        {"oom-score-adj", 0, Kind::kInt32, Scope::kConfig, "-999",
         "The oom-score-adj value for the kproxy process; within [-1000, 1000].",
         int32Setter([](C& c, std::int32_t n) { c.oomScoreAdj = n; })},
        {"conntrack-max-per-core", 0, Kind::kInt32, Scope::kConfig, "32768",
         "Maximum number of NAT connections to track per CPU core (0 to leave the limit as-is "
         "and ignore conntrack-min).",
         int32Setter([](C& c, std::int32_t n) { c.conntrack.maxPerCore = n; })},
        {"conntrack-min", 0, Kind::kInt32, Scope::kConfig, "131072",
         "Minimum number of conntrack entries to allocate, regardless of conntrack-max-per-core.",
         int32Setter([](C& c, std::int32_t n) { c.conntrack.min = n; })},
        {"conntrack-tcp-timeout-established", 0, Kind::kDuration, Scope::kConfig, "24h0m0s",
         "Idle timeout for established TCP connections (0 to leave as-is).",
         durationSetter([](C& c, Duration d) { c.conntrack.tcpEstablishedTimeout = d; })},
        {"conntrack-tcp-timeout-close-wait", 0, Kind::kDuration, Scope::kConfig, "1h0m0s",
         "NAT timeout for TCP connections in the CLOSE_WAIT state.",
         durationSetter([](C& c, Duration d) { c.conntrack.tcpCloseWaitTimeout = d; })},
        {"conntrack-tcp-be-liberal", 0, Kind::kBool, Scope::kConfig, "false",
         "Enable liberal mode for tracking TCP packets (nf_conntrack_tcp_be_liberal=1).",
         boolSetter([](ParsedFlags& f, bool b) { f.config.conntrack.tcpBeLiberal = b; })},
        {"conntrack-udp-timeout", 0, Kind::kDuration, Scope::kConfig, "0s",
         "Idle timeout for UNREPLIED UDP connections (0 to leave as-is).",
         durationSetter([](C& c, Duration d) { c.conntrack.udpTimeout = d; })},
        {"conntrack-udp-timeout-stream", 0, Kind::kDuration, Scope::kConfig, "0s",
         "Idle timeout for ASSURED UDP connections (0 to leave as-is).",
         durationSetter([](C& c, Duration d) { c.conntrack.udpStreamTimeout = d; })},
        {"config-sync-period", 0, Kind::kDuration, Scope::kConfig, "15m0s",
         "How often configuration from the apiserver is refreshed; > 0.",
         durationSetter([](C& c, Duration d) { c.configSyncPeriod = d; })},
        {"feature-gates", 0, Kind::kFeatureGates, Scope::kConfig, "",
         "Comma-separated key=true|false pairs that enable or disable features.",
         [](ParsedFlags& f, std::string_view v) -> std::optional<std::string> {
           for (const auto& pair : splitComma(v)) {
             if (pair.empty()) continue;
             const auto eq = pair.find('=');
             if (eq == std::string::npos) return fmt::format("missing bool value for {}", pair);
             const auto value = parseBool(std::string_view(pair).substr(eq + 1));
             if (!value) {
               return fmt::format("invalid value of {}: {}, err: must be true or false",
                                  pair.substr(0, eq), pair.substr(eq + 1));
             }
             f.config.featureGates[pair.substr(0, eq)] = *value;
           }
           return std::nullopt;
         }},
    };
    std::sort(s.begin(), s.end(), [](const FlagSpec& a, const FlagSpec& b) { return a.name < b.name; });
    return s;
  }();
  return specs;
}

const FlagSpec* findLong(std::string_view name) {
  for (const auto& spec : flagSpecs()) {
    if (spec.name == name) return &spec;
  }
  return nullptr;
}

const FlagSpec* findShort(char c) {
  for (const auto& spec : flagSpecs()) {
    if (spec.shorthand == c) return &spec;
  }
  return nullptr;
}

std::string_view typeName(Kind kind) {
  switch (kind) {
    case Kind::kBool:
      return "";
    case Kind::kString:
      return "string";
    case Kind::kInt32:
      return "int32";
    case Kind::kFloat:
      return "float32";
    case Kind::kDuration:
      return "duration";
    case Kind::kStringList:
      return "strings";
    case Kind::kFeatureGates:
      return "mapStringBool";
    case Kind::kLevel:
      return "Level";
    case Kind::kQuantity:
      return "quantity";
  }
  return "";
}

std::string trim(std::string_view s) {
  const auto isSpace = [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; };
  while (!s.empty() && isSpace(s.front())) s.remove_prefix(1);
  while (!s.empty() && isSpace(s.back())) s.remove_suffix(1);
  return std::string(s);
}

}  // namespace

bool flagTakesNextArgument(std::string_view arg) {
  const FlagSpec* spec = nullptr;
  if (arg.starts_with("--") && arg.size() > 2) {
    if (arg.find('=') != std::string_view::npos) return false;
    spec = findLong(normalizedName(arg.substr(2)));
  } else if (arg.starts_with("-") && arg.size() == 2) {
    spec = findShort(arg[1]);
  }
  return spec != nullptr && spec->kind != Kind::kBool;
}

core::Result<ParsedFlags> parseFlags(std::span<const char* const> args) {
  ParsedFlags out;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string_view arg = args[i] != nullptr ? args[i] : "";
    if (arg == "--") {
      if (i + 1 < args.size()) {
        return makeError(ErrorCategory::kInvalidArgument,
                         fmt::format("unexpected argument \"{}\"", args[i + 1]));
      }
      break;
    }
    const FlagSpec* spec = nullptr;
    std::string shown;  // the flag as the user spelled it, for messages
    std::optional<std::string_view> value;
    if (arg.starts_with("--") && arg.size() > 2) {
      std::string_view body = arg.substr(2);
      const auto eq = body.find('=');
      if (eq != std::string_view::npos) {
        value = body.substr(eq + 1);
        body = body.substr(0, eq);
      }
      shown = fmt::format("--{}", body);
      spec = findLong(normalizedName(body));
    } else if (arg.starts_with("-") && arg.size() > 1 && arg[1] != '-') {
      spec = findShort(arg[1]);
      const std::string_view rest = arg.substr(2);
      shown = fmt::format("-{}", arg[1]);
      if (rest.starts_with("=")) {
        value = rest.substr(1);
      } else if (!rest.empty()) {
        // "-v5" carries its value; anything else is not a flag kproxy knows ("-config").
        if (spec == nullptr || spec->kind == Kind::kBool) {
          const auto eq = arg.find('=');
          return makeError(ErrorCategory::kInvalidArgument,
                           fmt::format("unknown flag: {}", arg.substr(0, eq)));
        }
        value = rest;
      }
    } else {
      return makeError(ErrorCategory::kInvalidArgument, fmt::format("unexpected argument \"{}\"", arg));
    }
    if (spec == nullptr) {
      return makeError(ErrorCategory::kInvalidArgument, fmt::format("unknown flag: {}", shown));
    }
    if (!value) {
      if (spec->kind == Kind::kBool) {
        value = "true";
      } else if (i + 1 < args.size() && args[i + 1] != nullptr) {
        value = args[++i];
      } else {
        return makeError(ErrorCategory::kInvalidArgument,
                         fmt::format("flag needs an argument: {}", shown));
      }
    }
    if (auto reason = spec->set(out, *value)) {
      return makeError(ErrorCategory::kInvalidArgument,
                       fmt::format("invalid value \"{}\" for flag {}: {}", *value, shown, *reason));
    }
    out.explicitlySet.insert(std::string(spec->name));
    if (!spec->deprecated.empty()) {
      // pflag's words, once per use.
      out.warnings.push_back(fmt::format("Flag --{} has been deprecated, {}", spec->name, spec->deprecated));
    }
  }
  return out;
}

core::Result<ProxyConfig> effectiveConfig(const ParsedFlags& flags) {
  const ProxyConfig& f = flags.config;
  ProxyConfig config;
  if (flags.configFile.empty()) {
    config = f;
    // upstream's addressFromDeprecatedFlags, applied only without --config and
    // --write-config-to: port 0 disables the server, another is appended to an address given
    // without one (the defaults already carry theirs).
    if (flags.writeConfigTo.empty()) {
      auto fromDeprecated = [](const std::string& given, const std::string& current, std::int32_t port) {
        if (port == 0) return std::string();
        return given.empty() ? current : appendPortIfNeeded(given, port);
      };
      config.healthzBindAddress = fromDeprecated(flags.healthzBindAddressGiven, config.healthzBindAddress,
                                                 flags.healthzPort);
      config.metricsBindAddress = fromDeprecated(flags.metricsBindAddressGiven, config.metricsBindAddress,
                                                 flags.metricsPort);
    }
  } else {
    auto loaded = loadConfigFile(flags.configFile);
    if (!loaded) return std::unexpected(loaded.error());
    config = std::move(*loaded);
    // Logging flags given on the command line win over the file (upstream copyLogsFromFlags,
    // so that `--config ... -v=5` works).
    if (flags.isSet("v")) config.logging.verbosity = f.logging.verbosity;
    if (flags.isSet("logging-format")) config.logging.format = f.logging.format;
    if (flags.isSet("log-flush-frequency")) config.logging.flushFrequency = f.logging.flushFrequency;
    // vmodule's flag items come first and the file's after them, as upstream joins them.
    if (flags.isSet("vmodule")) {
      std::vector<std::string> joined = f.logging.vmodule;
      joined.insert(joined.end(), config.logging.vmodule.begin(), config.logging.vmodule.end());
      config.logging.vmodule = std::move(joined);
    }
    if (flags.isSet("log-text-split-stream")) config.logging.textSplitStream = f.logging.textSplitStream;
    if (flags.isSet("log-text-info-buffer-size")) config.logging.textInfoBufferSize = f.logging.textInfoBufferSize;
    if (flags.isSet("log-json-split-stream")) config.logging.jsonSplitStream = f.logging.jsonSplitStream;
    if (flags.isSet("log-json-info-buffer-size")) config.logging.jsonInfoBufferSize = f.logging.jsonInfoBufferSize;
    // Process options are never in the file.
    config.master = f.master;
    config.manifestsDir = f.manifestsDir;
    config.allowHttpCredentials = f.allowHttpCredentials;
    config.pluginDirs = f.pluginDirs;
    config.dryRun = f.dryRun;
    config.cleanup = f.cleanup;
    config.initOnly = f.initOnly;
    config.showHelp = f.showHelp;
    config.showVersion = f.showVersion;
    config.iptablesVariant = f.iptablesVariant;
    config.userspace = f.userspace;
    config.ebpf = f.ebpf;
    config.verifyPeriod = f.verifyPeriod;
  }
  // upstream processHostnameOverrideFlag: a non-empty flag wins over the file, trimmed and
  // lower-cased.
  if (flags.isSet("hostname-override") && !f.hostnameOverride.empty()) {
    const std::string name = trim(f.hostnameOverride);
    if (name.empty()) {
      return makeError(ErrorCategory::kInvalidArgument,
                       fmt::format("invalid value \"{}\" for flag --hostname-override: must not be "
                                   "blank",
                                   f.hostnameOverride));
    }
    config.hostnameOverride.clear();
    for (char c : name) {
      config.hostnameOverride += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    }
  }
  applyPlatformDefaults(config);
  return config;
}

std::vector<std::string> ignoredFlags(const ParsedFlags& flags) {
  std::vector<std::string> ignored;
  if (flags.configFile.empty()) return ignored;
  for (const auto& spec : flagSpecs()) {
    if (spec.scope == Scope::kConfig && flags.isSet(spec.name)) {
      ignored.push_back(fmt::format("--{}", spec.name));
    }
  }
  return ignored;
}

std::string usage() {
  std::string out =
      "kproxy: a Kubernetes service proxy (a drop-in for kube-proxy).\n"
      "\n"
      "Usage:\n"
      "  kproxy [flags]\n"
      "\n"
      "With --config, the file's values are used and the command-line flags that set\n"
      "KubeProxyConfiguration fields are ignored, as in kube-proxy; -v, --logging-format and\n"
      "--hostname-override still apply.\n"
      "\n"
      "Flags:\n";
  for (const auto& spec : flagSpecs()) {
    if (!spec.deprecated.empty()) continue;  // pflag hides deprecated flags from the help
    std::string head = spec.shorthand != 0 ? fmt::format("  -{}, --{}", spec.shorthand, spec.name)
                                           : fmt::format("      --{}", spec.name);
    if (const auto type = typeName(spec.kind); !type.empty()) head += fmt::format(" {}", type);
    std::string text(spec.help);
    if (!spec.defaultText.empty() && spec.defaultText != "false") {
      text += fmt::format(" (default {})", spec.defaultText);
    }
    if (spec.scope == Scope::kConfig) text += " Ignored with --config.";
    if (head.size() < 44) {
      out += fmt::format("{:<44}{}\n", head, text);
    } else {
      out += fmt::format("{}\n{:<44}{}\n", head, "", text);
    }
  }
  return out;
}

}  // namespace kproxy::cli
