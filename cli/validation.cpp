#include "validation.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>

#include "feature_gates.h"
#include "net_util.h"

namespace kproxy::cli {
namespace {

// Collects one-line problems; `flag` is the command-line flag that sets the field, if any.
class Problems {
 public:
  void invalid(std::string_view field, std::string_view flag, std::string_view value,
               std::string_view reason) {
    if (flag.empty()) {
      lines.push_back(fmt::format("invalid {} \"{}\": {}", field, value, reason));
    } else {
      lines.push_back(fmt::format("invalid {} \"{}\" (flag --{}): {}", field, value, flag, reason));
    }
  }
  std::vector<std::string> lines;
};

std::string show(Duration d) { return formatGoDuration(d); }

std::string joinList(const std::vector<std::string>& values) {
  std::string out;
  for (const auto& v : values) {
    if (!out.empty()) out += ",";
    out += v;
  }
  return out;
}

void checkSyncPeriods(Problems& p, std::string_view section, Duration sync, Duration minSync,
                      std::string_view syncFlag, std::string_view minSyncFlag) {
  const std::string syncField = fmt::format("{}.syncPeriod", section);
  const std::string minField = fmt::format("{}.minSyncPeriod", section);
  if (sync <= Duration{0}) p.invalid(syncField, syncFlag, show(sync), "must be greater than 0");
  if (minSync < Duration{0}) {
    p.invalid(minField, minSyncFlag, show(minSync), "must be greater than or equal to 0");
  } else if (minSync > sync && sync > Duration{0}) {
    p.invalid(minField, minSyncFlag, show(minSync),
              fmt::format("must be less than or equal to {} ({})", syncField, show(sync)));
  }
}

void checkNonNegative(Problems& p, std::string_view field, std::string_view flag, Duration d) {
  if (d < Duration{0}) p.invalid(field, flag, show(d), "must be greater than or equal to 0");
}

void checkMasqueradeBit(Problems& p, std::string_view field, std::int32_t bit) {
  if (bit < 0 || bit > 31) {
    p.invalid(field, "iptables-masquerade-bit", std::to_string(bit),
              "must be within the range [0, 31]");
  }
}

// IP:port with a real IP and a port in 1..65535 (upstream validateHostPort).
void checkHostPort(Problems& p, std::string_view field, std::string_view flag,
                   const std::string& value) {
  const auto hp = splitHostPort(value);
  if (!hp) {
    p.invalid(field, flag, value, "must be IP:port");
    return;
  }
  if (!ipFamilyOf(hp->host)) {
    p.invalid(field, flag, value, fmt::format("\"{}\" is not a valid IP address", hp->host));
    return;
  }
  int port = 0;
  const auto [ptr, ec] = std::from_chars(hp->port.data(), hp->port.data() + hp->port.size(), port);
  if (ec != std::errc{} || ptr != hp->port.data() + hp->port.size() || port < 1 || port > 65535) {
    p.invalid(field, flag, value, "port must be a number between 1 and 65535");
  }
}

bool parsePort(std::string_view s, int& out) {
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc{} && ptr == s.data() + s.size() && !s.empty();
}

// utilnet.ParsePortRange: "base-max" or "base+size" (or a single port), all within 0..65535.
bool isPortRange(std::string_view s) {
  int base = 0;
  int other = 0;
  if (const auto dash = s.find('-'); dash != std::string_view::npos) {
    return parsePort(s.substr(0, dash), base) && parsePort(s.substr(dash + 1), other) &&
           base >= 0 && other <= 65535 && base <= other;
  }
  if (const auto plus = s.find('+'); plus != std::string_view::npos) {
    return parsePort(s.substr(0, plus), base) && parsePort(s.substr(plus + 1), other) &&
           base >= 0 && other >= 0 && base + other <= 65535;
  }
  return parsePort(s, base) && base >= 0 && base <= 65535;
}

constexpr std::string_view kIpvsSchedulers[] = {"rr",  "wrr", "lc", "wlc", "lblc", "lblcr",
                                                "sh",  "dh",  "sed", "nq", "mh"};
constexpr std::string_view kDetectLocalModes[] = {"ClusterCIDR", "NodeCIDR", "BridgeInterface",
                                                  "InterfaceNamePrefix"};

}  // namespace

std::vector<std::string> validationErrors(const ProxyConfig& c,
                                          std::span<const std::string> availableModes) {
  Problems p;

  std::vector<std::string> modes(availableModes.begin(), availableModes.end());
  std::sort(modes.begin(), modes.end());
  if (std::find(modes.begin(), modes.end(), c.mode) == modes.end()) {
    std::string list;
    for (const auto& m : modes) list += (list.empty() ? "" : ", ") + m;
    p.lines.push_back(fmt::format("unknown proxy mode \"{}\"; available: {}", c.mode,
                                  list.empty() ? "none (no backend plugin was loaded)" : list));
  }

  // Only the section of the selected mode is in effect (upstream validates the same one).
  // --iptables-sync-period also sets the nftables section, as upstream's flag does.
  if (c.mode == "ipvs") {
    checkSyncPeriods(p, "ipvs", c.ipvs.syncPeriod, c.ipvs.minSyncPeriod, "ipvs-sync-period",
                     "ipvs-min-sync-period");
    if (!c.ipvs.scheduler.empty() &&
        std::find(std::begin(kIpvsSchedulers), std::end(kIpvsSchedulers), c.ipvs.scheduler) ==
            std::end(kIpvsSchedulers)) {
      p.invalid("ipvs.scheduler", "ipvs-scheduler", c.ipvs.scheduler,
                "must be one of rr, wrr, lc, wlc, lblc, lblcr, sh, dh, sed, nq, mh, or empty "
                "for the default (rr)");
    }
    for (const auto& cidr : c.ipvs.excludeCIDRs) {
      if (!isCIDR(cidr)) p.invalid("ipvs.excludeCIDRs", "ipvs-exclude-cidrs", cidr, "must be a valid CIDR");
    }
    checkNonNegative(p, "ipvs.tcpTimeout", "ipvs-tcp-timeout", c.ipvs.tcpTimeout);
    checkNonNegative(p, "ipvs.tcpFinTimeout", "ipvs-tcpfin-timeout", c.ipvs.tcpFinTimeout);
    checkNonNegative(p, "ipvs.udpTimeout", "ipvs-udp-timeout", c.ipvs.udpTimeout);
  } else if (c.mode == "nftables") {
    checkSyncPeriods(p, "nftables", c.nftables.syncPeriod, c.nftables.minSyncPeriod,
                     "iptables-sync-period", "iptables-min-sync-period");
  } else {
    checkSyncPeriods(p, "iptables", c.iptables.syncPeriod, c.iptables.minSyncPeriod,
                     "iptables-sync-period", "iptables-min-sync-period");
  }
  checkMasqueradeBit(p, "iptables.masqueradeBit", c.iptables.masqueradeBit);
  checkMasqueradeBit(p, "nftables.masqueradeBit", c.nftables.masqueradeBit);

  if (c.conntrack.maxPerCore < 0) {
    p.invalid("conntrack.maxPerCore", "conntrack-max-per-core", std::to_string(c.conntrack.maxPerCore),
              "must be greater than or equal to 0");
  }
  if (c.conntrack.min < 0) {
    p.invalid("conntrack.min", "conntrack-min", std::to_string(c.conntrack.min),
              "must be greater than or equal to 0");
  }
  checkNonNegative(p, "conntrack.tcpEstablishedTimeout", "conntrack-tcp-timeout-established",
                   c.conntrack.tcpEstablishedTimeout);
  checkNonNegative(p, "conntrack.tcpCloseWaitTimeout", "conntrack-tcp-timeout-close-wait",
                   c.conntrack.tcpCloseWaitTimeout);
  checkNonNegative(p, "conntrack.udpTimeout", "conntrack-udp-timeout", c.conntrack.udpTimeout);
  checkNonNegative(p, "conntrack.udpStreamTimeout", "conntrack-udp-timeout-stream",
                   c.conntrack.udpStreamTimeout);

  if (c.clientConnection.burst < 0) {
    p.invalid("clientConnection.burst", "kube-api-burst", std::to_string(c.clientConnection.burst),
              "must be greater than or equal to 0");
  }
  if (c.oomScoreAdj < -1000 || c.oomScoreAdj > 1000) {
    p.invalid("oomScoreAdj", "oom-score-adj", std::to_string(c.oomScoreAdj),
              "must be within the range [-1000, 1000]");
  }
  if (c.configSyncPeriod <= Duration{0}) {
    p.invalid("configSyncPeriod", "config-sync-period", show(c.configSyncPeriod),
              "must be greater than 0");
  }
  if (!ipFamilyOf(c.bindAddress)) {
    p.invalid("bindAddress", "bind-address", c.bindAddress, "must be a valid IP address");
  }
  if (!c.healthzBindAddress.empty()) {
    checkHostPort(p, "healthzBindAddress", "healthz-bind-address", c.healthzBindAddress);
  }
  if (!c.metricsBindAddress.empty()) {
    checkHostPort(p, "metricsBindAddress", "metrics-bind-address", c.metricsBindAddress);
  }

  if (!c.clusterCIDR.empty()) {
    std::vector<std::string> cidrs;
    std::size_t start = 0;
    while (true) {
      const auto comma = c.clusterCIDR.find(',', start);
      cidrs.push_back(c.clusterCIDR.substr(start, comma - start));
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
    bool allValid = true;
    for (const auto& cidr : cidrs) allValid = allValid && isCIDR(cidr);
    if (cidrs.size() > 2) {
      p.invalid("clusterCIDR", "cluster-cidr", c.clusterCIDR,
                "must be one CIDR or a dual-stack pair (e.g. 10.100.0.0/16,fde4:8dba:82e1::/48)");
    } else if (!allValid) {
      p.invalid("clusterCIDR", "cluster-cidr", c.clusterCIDR,
                "must be a valid CIDR (e.g. 10.100.0.0/16 or fde4:8dba:82e1::/48)");
    } else if (cidrs.size() == 2 && (cidrs[0].find(':') == std::string::npos) ==
                                        (cidrs[1].find(':') == std::string::npos)) {
      p.invalid("clusterCIDR", "cluster-cidr", c.clusterCIDR,
                "two CIDRs must be one IPv4 and one IPv6 (e.g. 10.100.0.0/16,fde4:8dba:82e1::/48)");
    }
  }

  if (!c.portRange.empty() && !isPortRange(c.portRange)) {
    p.invalid("portRange", "", c.portRange, "must be a valid port range (e.g. 300-2000)");
  }

  for (const auto& address : c.nodePortAddresses) {
    if (address == "primary") {
      if (c.nodePortAddresses.size() != 1) {
        p.invalid("nodePortAddresses", "nodeport-addresses", joinList(c.nodePortAddresses),
                  "\"primary\" cannot be combined with other entries");
      }
    } else if (!isCIDR(address)) {
      p.invalid("nodePortAddresses", "nodeport-addresses", address,
                "must be a CIDR (e.g. 192.168.0.0/24) or the keyword primary");
    }
  }

  if (!c.detectLocalMode.empty() &&
      std::find(std::begin(kDetectLocalModes), std::end(kDetectLocalModes), c.detectLocalMode) ==
          std::end(kDetectLocalModes)) {
    p.invalid("detectLocalMode", "detect-local-mode", c.detectLocalMode,
              "must be one of ClusterCIDR, NodeCIDR, BridgeInterface, InterfaceNamePrefix");
  }
  if (c.detectLocalMode == "BridgeInterface" && c.detectLocal.bridgeInterface.empty()) {
    p.invalid("detectLocal.bridgeInterface", "pod-bridge-interface", "",
              "must be set when detectLocalMode is BridgeInterface");
  }
  if (c.detectLocalMode == "InterfaceNamePrefix" && c.detectLocal.interfaceNamePrefix.empty()) {
    p.invalid("detectLocal.interfaceNamePrefix", "pod-interface-name-prefix", "",
              "must be set when detectLocalMode is InterfaceNamePrefix");
  }
  if (c.logging.format != "text" && c.logging.format != "json") {
    p.invalid("logging.format", "logging-format", c.logging.format, "must be text or json");
  }
  // upstream's featuregate.SetFromMap, then logsapi.Validate's gated options.
  for (auto& line : featureGateErrors(c.featureGates)) p.lines.push_back(std::move(line));
  const bool alphaOptions = featureEnabled(c.featureGates, "LoggingAlphaOptions");
  auto gated = [&](bool set, std::string_view field, std::string_view flag) {
    if (set && !alphaOptions)
      p.lines.push_back(fmt::format("{}: Forbidden: Feature LoggingAlphaOptions is disabled (flag --{})", field, flag));
  };
  gated(c.logging.textSplitStream, "logging.options.text.splitStream", "log-text-split-stream");
  gated(c.logging.textInfoBufferSize != 0, "logging.options.text.infoBufferSize", "log-text-info-buffer-size");
  gated(c.logging.jsonSplitStream, "logging.options.json.splitStream", "log-json-split-stream");
  gated(c.logging.jsonInfoBufferSize != 0, "logging.options.json.infoBufferSize", "log-json-info-buffer-size");
  // logsapi.Validate: vmodule only for the text format.
  if (!c.logging.vmodule.empty() && c.logging.format != "text") {
    p.lines.push_back("logging.vmodule: Forbidden: Only supported for text log format (flag --vmodule)");
  }
  return p.lines;
}

core::Result<void> validate(const ProxyConfig& config, std::span<const std::string> availableModes) {
  auto problems = validationErrors(config, availableModes);
  if (problems.empty()) return {};
  return core::makeError(core::ErrorCategory::kInvalidArgument, std::move(problems.front()));
}

std::vector<std::string> nodePortAddressWarnings(const ProxyConfig& config) {
  const auto& npa = config.nodePortAddresses;
  if (npa.empty()) {
    return {"nodePortAddresses is unset; NodePort connections will be accepted on all local IPs. "
            "Consider using `--nodeport-addresses primary`"};
  }
  if (npa.size() == 1 && npa.front() == "primary") return {};
  auto families = [](const std::vector<std::string>& cidrs) {
    std::pair<bool, bool> v4v6{false, false};
    for (const auto& c : cidrs) (c.find(':') == std::string::npos ? v4v6.first : v4v6.second) = true;
    return v4v6;
  };
  std::vector<std::string> clusterCIDRs;
  for (std::size_t start = 0; !config.clusterCIDR.empty();) {
    const auto comma = config.clusterCIDR.find(',', start);
    clusterCIDRs.push_back(config.clusterCIDR.substr(start, comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  const auto dual = [&](const std::vector<std::string>& v) {
    auto [v4, v6] = families(v);
    return v4 && v6;
  };
  const auto [v4, v6] = families(npa);
  if (v4 == v6 || !(dual(clusterCIDRs) || dual(config.ipvs.excludeCIDRs))) return {};
  return {std::string("cluster appears to be dual-stack but nodePortAddresses contains only ") +
          (v4 ? "IPv4" : "IPv6") + " addresses; NodePort connections will be accepted on all local " +
          (v4 ? "IPv6" : "IPv4") + " IPs"};
}

}  // namespace kproxy::cli
