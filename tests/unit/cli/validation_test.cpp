#include "validation.h"
#include "feature_gates.h"

#include <catch2/catch.hpp>

using namespace kproxy::cli;
using namespace std::chrono_literals;

namespace {

const std::vector<std::string> kModes = {"nftables", "iptables", "ipvs"};

// nftables mode: the cases below name its sections.
ProxyConfig valid() {
  ProxyConfig c;
  c.mode = "nftables";
  applyPlatformDefaults(c);
  return c;
}

// The single problem `c` has.
std::string onlyError(const ProxyConfig& c) {
  const auto errors = validationErrors(c, kModes);
  INFO(errors.size());
  REQUIRE(errors.size() == 1);
  CHECK(errors.front().find('\n') == std::string::npos);
  return errors.front();
}

}  // namespace

TEST_CASE("the defaults are valid", "[unit]") {
  CHECK(validationErrors(valid(), kModes).empty());
  CHECK(validate(valid(), kModes).has_value());
  for (const char* mode : {"iptables", "ipvs"}) {
    ProxyConfig c = valid();
    c.mode = mode;
    CHECK(validationErrors(c, kModes).empty());
  }
}

TEST_CASE("the mode must be one of the available ones", "[unit]") {
  ProxyConfig c = valid();
  c.mode = "foo";
  const std::vector<std::string> loaded = {"nftables", "iptables"};
  auto r = validate(c, loaded);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().message() == "unknown proxy mode \"foo\"; available: iptables, nftables");
  CHECK(r.error().category == kproxy::core::ErrorCategory::kInvalidArgument);
  c.mode = "ipvs";  // a real upstream mode, but no plugin for it
  CHECK(validate(c, loaded).error().message() ==
        "unknown proxy mode \"ipvs\"; available: iptables, nftables");
  CHECK(validate(c, {}).error().message() ==
        "unknown proxy mode \"ipvs\"; available: none (no backend plugin was loaded)");
  c.mode = "ebpf";
  const std::vector<std::string> withThirdParty = {"ebpf", "nftables"};
  CHECK(validate(c, withThirdParty).has_value());
}

TEST_CASE("sync period errors name the field, the flag and the value", "[unit]") {
  ProxyConfig c = valid();
  c.nftables.syncPeriod = 0s;
  CHECK(onlyError(c) ==
        "invalid nftables.syncPeriod \"0s\" (flag --iptables-sync-period): must be greater than 0");
  c = valid();
  c.nftables.minSyncPeriod = 1min;
  CHECK(onlyError(c) ==
        "invalid nftables.minSyncPeriod \"1m0s\" (flag --iptables-min-sync-period): must be less "
        "than or equal to nftables.syncPeriod (30s)");
  c = valid();
  c.mode = "iptables";
  c.iptables.minSyncPeriod = -1s;
  CHECK(onlyError(c) ==
        "invalid iptables.minSyncPeriod \"-1s\" (flag --iptables-min-sync-period): must be "
        "greater than or equal to 0");
  c = valid();
  c.mode = "ipvs";
  c.ipvs.syncPeriod = -5s;
  CHECK(onlyError(c) ==
        "invalid ipvs.syncPeriod \"-5s\" (flag --ipvs-sync-period): must be greater than 0");
  // minSyncPeriod == syncPeriod is allowed; 0 minSyncPeriod too.
  c = valid();
  c.nftables.minSyncPeriod = c.nftables.syncPeriod;
  CHECK(validationErrors(c, kModes).empty());
  c.nftables.minSyncPeriod = 0s;
  CHECK(validationErrors(c, kModes).empty());
  // Sections of other modes are not in effect.
  c = valid();
  c.ipvs.syncPeriod = 0s;
  CHECK(validationErrors(c, kModes).empty());
}

TEST_CASE("ipvs settings are checked in ipvs mode", "[unit]") {
  ProxyConfig c = valid();
  c.mode = "ipvs";
  c.ipvs.scheduler = "fastest";
  CHECK(onlyError(c) ==
        "invalid ipvs.scheduler \"fastest\" (flag --ipvs-scheduler): must be one of rr, wrr, lc, "
        "wlc, lblc, lblcr, sh, dh, sed, nq, mh, or empty for the default (rr)");
  c.ipvs.scheduler = "rr";
  c.ipvs.excludeCIDRs = {"10.0.0.0/33"};
  CHECK(onlyError(c) ==
        "invalid ipvs.excludeCIDRs \"10.0.0.0/33\" (flag --ipvs-exclude-cidrs): must be a valid CIDR");
  c.ipvs.excludeCIDRs.clear();
  c.ipvs.udpTimeout = -1s;
  CHECK(onlyError(c) ==
        "invalid ipvs.udpTimeout \"-1s\" (flag --ipvs-udp-timeout): must be greater than or equal to 0");
}

TEST_CASE("masquerade bit, conntrack, oom, burst and config sync period ranges", "[unit]") {
  ProxyConfig c = valid();
  c.iptables.masqueradeBit = 32;
  CHECK(onlyError(c) ==
        "invalid iptables.masqueradeBit \"32\" (flag --iptables-masquerade-bit): must be within "
        "the range [0, 31]");
  c = valid();
  c.nftables.masqueradeBit = -1;
  CHECK(onlyError(c) ==
        "invalid nftables.masqueradeBit \"-1\" (flag --iptables-masquerade-bit): must be within "
        "the range [0, 31]");
  c = valid();
  c.conntrack.maxPerCore = -1;
  CHECK(onlyError(c) ==
        "invalid conntrack.maxPerCore \"-1\" (flag --conntrack-max-per-core): must be greater "
        "than or equal to 0");
  c = valid();
  c.conntrack.min = -2;
  CHECK(onlyError(c) ==
        "invalid conntrack.min \"-2\" (flag --conntrack-min): must be greater than or equal to 0");
  c = valid();
  c.conntrack.tcpEstablishedTimeout = -1h;
  CHECK(onlyError(c) ==
        "invalid conntrack.tcpEstablishedTimeout \"-1h0m0s\" (flag "
        "--conntrack-tcp-timeout-established): must be greater than or equal to 0");
  c = valid();
  c.conntrack.tcpCloseWaitTimeout = -1s;
  CHECK(onlyError(c) ==
        "invalid conntrack.tcpCloseWaitTimeout \"-1s\" (flag --conntrack-tcp-timeout-close-wait): "
        "must be greater than or equal to 0");
  c = valid();
  c.oomScoreAdj = 1001;
  CHECK(onlyError(c) ==
        "invalid oomScoreAdj \"1001\" (flag --oom-score-adj): must be within the range [-1000, 1000]");
  c = valid();
  c.clientConnection.burst = -1;
  CHECK(onlyError(c) ==
        "invalid clientConnection.burst \"-1\" (flag --kube-api-burst): must be greater than or "
        "equal to 0");
  c = valid();
  c.configSyncPeriod = 0s;
  CHECK(onlyError(c) ==
        "invalid configSyncPeriod \"0s\" (flag --config-sync-period): must be greater than 0");
}

TEST_CASE("addresses must be IP and IP:port", "[unit]") {
  ProxyConfig c = valid();
  c.bindAddress = "node1";
  CHECK(onlyError(c) ==
        "invalid bindAddress \"node1\" (flag --bind-address): must be a valid IP address");
  c = valid();
  c.healthzBindAddress = "0.0.0.0";
  CHECK(onlyError(c) ==
        "invalid healthzBindAddress \"0.0.0.0\" (flag --healthz-bind-address): must be IP:port");
  c = valid();
  c.metricsBindAddress = "localhost:10249";
  CHECK(onlyError(c) ==
        "invalid metricsBindAddress \"localhost:10249\" (flag --metrics-bind-address): "
        "\"localhost\" is not a valid IP address");
  c = valid();
  c.metricsBindAddress = "127.0.0.1:70000";
  CHECK(onlyError(c) ==
        "invalid metricsBindAddress \"127.0.0.1:70000\" (flag --metrics-bind-address): port must "
        "be a number between 1 and 65535");
  c = valid();
  c.healthzBindAddress = "[::1]:0";
  CHECK(onlyError(c) ==
        "invalid healthzBindAddress \"[::1]:0\" (flag --healthz-bind-address): port must be a "
        "number between 1 and 65535");
  c = valid();
  c.healthzBindAddress = "";  // disabled
  c.metricsBindAddress = "[::]:10249";
  CHECK(validationErrors(c, kModes).empty());
}

TEST_CASE("cluster CIDRs", "[unit]") {
  ProxyConfig c = valid();
  for (const char* good : {"10.244.0.0/16", "fd00::/48", "10.244.0.0/16,fd00::/48"}) {
    c.clusterCIDR = good;
    CHECK(validationErrors(c, kModes).empty());
  }
  c.clusterCIDR = "10.244.0.0";
  CHECK(onlyError(c) ==
        "invalid clusterCIDR \"10.244.0.0\" (flag --cluster-cidr): must be a valid CIDR (e.g. "
        "10.100.0.0/16 or fde4:8dba:82e1::/48)");
  c.clusterCIDR = "10.0.0.0/8,10.1.0.0/16";
  CHECK(onlyError(c) ==
        "invalid clusterCIDR \"10.0.0.0/8,10.1.0.0/16\" (flag --cluster-cidr): two CIDRs must be "
        "one IPv4 and one IPv6 (e.g. 10.100.0.0/16,fde4:8dba:82e1::/48)");
  c.clusterCIDR = "10.0.0.0/8,fd00::/48,10.1.0.0/16";
  CHECK(onlyError(c).starts_with("invalid clusterCIDR \"10.0.0.0/8,fd00::/48,10.1.0.0/16\" (flag "
                                 "--cluster-cidr): must be one CIDR or a dual-stack pair"));
}

TEST_CASE("nodePortAddresses are CIDRs or primary, as upstream", "[unit]") {
  ProxyConfig c = valid();
  c.nodePortAddresses = {"10.0.0.0/8", "fd00::/64", "0.0.0.0/0", "127.0.0.1/32"};
  CHECK(validationErrors(c, kModes).empty());
  c.nodePortAddresses = {"primary"};
  CHECK(validationErrors(c, kModes).empty());
  c.nodePortAddresses = {"10.0.0.1"};
  CHECK(onlyError(c) ==
        "invalid nodePortAddresses \"10.0.0.1\" (flag --nodeport-addresses): must be a CIDR "
        "(e.g. 192.168.0.0/24) or the keyword primary");
  // Upstream has no such keywords; every backend would have to invent a meaning for them.
  for (const char* keyword : {"all", "localhost"}) {
    c.nodePortAddresses = {keyword};
    CHECK(onlyError(c) == "invalid nodePortAddresses \"" + std::string(keyword) +
                              "\" (flag --nodeport-addresses): must be a CIDR (e.g. 192.168.0.0/24) or "
                              "the keyword primary");
  }
  c.nodePortAddresses = {"primary", "10.0.0.0/8"};
  CHECK(onlyError(c) ==
        "invalid nodePortAddresses \"primary,10.0.0.0/8\" (flag --nodeport-addresses): \"primary\" "
        "cannot be combined with other entries");
}

TEST_CASE("nodePortAddresses that leave a family open are warned about, as upstream", "[unit]") {
  ProxyConfig c = valid();
  c.nodePortAddresses = {};
  CHECK(nodePortAddressWarnings(c) ==
        std::vector<std::string>{"nodePortAddresses is unset; NodePort connections will be accepted on "
                                 "all local IPs. Consider using `--nodeport-addresses primary`"});
  c.nodePortAddresses = {"primary"};
  CHECK(nodePortAddressWarnings(c).empty());
  c.nodePortAddresses = {"192.168.0.0/16"};
  c.clusterCIDR = "10.244.0.0/16";
  CHECK(nodePortAddressWarnings(c).empty());  // single-stack: nothing to say
  c.clusterCIDR = "10.244.0.0/16,fd00:10:244::/56";
  CHECK(nodePortAddressWarnings(c) ==
        std::vector<std::string>{"cluster appears to be dual-stack but nodePortAddresses contains only "
                                 "IPv4 addresses; NodePort connections will be accepted on all local IPv6 IPs"});
  c.nodePortAddresses = {"192.168.0.0/16", "fd00::/64"};
  CHECK(nodePortAddressWarnings(c).empty());
}

TEST_CASE("detect-local mode, port range and logging format", "[unit]") {
  ProxyConfig c = valid();
  c.detectLocalMode = "Magic";
  CHECK(onlyError(c) ==
        "invalid detectLocalMode \"Magic\" (flag --detect-local-mode): must be one of ClusterCIDR, "
        "NodeCIDR, BridgeInterface, InterfaceNamePrefix");
  c.detectLocalMode = "BridgeInterface";
  CHECK(onlyError(c) ==
        "invalid detectLocal.bridgeInterface \"\" (flag --pod-bridge-interface): must be set when "
        "detectLocalMode is BridgeInterface");
  c.detectLocal.bridgeInterface = "cbr0";
  CHECK(validationErrors(c, kModes).empty());
  c.detectLocalMode = "InterfaceNamePrefix";
  CHECK(onlyError(c) ==
        "invalid detectLocal.interfaceNamePrefix \"\" (flag --pod-interface-name-prefix): must be "
        "set when detectLocalMode is InterfaceNamePrefix");

  c = valid();
  for (const char* good : {"30000-32767", "8080", "100+10"}) {
    c.portRange = good;
    CHECK(validationErrors(c, kModes).empty());
  }
  c.portRange = "2000-300";
  CHECK(onlyError(c) == "invalid portRange \"2000-300\": must be a valid port range (e.g. 300-2000)");

  c = valid();
  c.logging.format = "xml";
  CHECK(onlyError(c) == "invalid logging.format \"xml\" (flag --logging-format): must be text or json");
}

TEST_CASE("all problems are reported, one line each", "[unit]") {
  ProxyConfig c = valid();
  c.mode = "bogus";
  c.oomScoreAdj = -2000;
  c.bindAddress = "x";
  const auto errors = validationErrors(c, kModes);
  CHECK(errors.size() == 3);
  CHECK(validate(c, kModes).error().message() == errors.front());
}

TEST_CASE("feature gates are checked against upstream 1.34's, with upstream's errors", "[unit]") {
  ProxyConfig c = valid();
  c.featureGates = {{"PreferSameTrafficDistribution", false}, {"AllAlpha", true}};
  CHECK(validationErrors(c, kModes).empty());
  c.featureGates = {{"NoSuchGate", true}};
  CHECK(onlyError(c) == "unrecognized feature gate: NoSuchGate");
  c.featureGates = {{"MultiCIDRServiceAllocator", false}};
  CHECK(onlyError(c) == "cannot set feature gate MultiCIDRServiceAllocator to false, feature is locked to true");
  c.featureGates = {{"LoadBalancerIPMode", true}};  // locked, but to this value
  CHECK(validationErrors(c, kModes).empty());
  CHECK(featureGateWarnings(c.featureGates) ==
        std::vector<std::string>{"Setting GA feature gate LoadBalancerIPMode=true. It will be removed in a future release."});
  c.featureGates = {{"ComponentFlagz", true}};
  CHECK(featureGateWarnings(c.featureGates) ==
        std::vector<std::string>{"feature gate ComponentFlagz is enabled but kproxy does not implement it; ignored"});
  CHECK(knownFeatureGateCount() > 200);
}

TEST_CASE("featureEnabled: explicit, then AllAlpha / AllBeta, then the 1.34 default", "[unit]") {
  CHECK(featureEnabled({}, "PreferSameTrafficDistribution"));  // Beta, on by default
  CHECK_FALSE(featureEnabled({{"PreferSameTrafficDistribution", false}}, "PreferSameTrafficDistribution"));
  CHECK_FALSE(featureEnabled({{"AllBeta", false}}, "PreferSameTrafficDistribution"));
  CHECK_FALSE(featureEnabled({}, "LoggingAlphaOptions"));
  CHECK(featureEnabled({{"AllAlpha", true}}, "LoggingAlphaOptions"));
  CHECK_FALSE(featureEnabled({}, "NoSuchGate"));
}

TEST_CASE("the [Alpha] logging options need LoggingAlphaOptions, as upstream's logsapi.Validate", "[unit]") {
  ProxyConfig c = valid();
  c.logging.textSplitStream = true;
  CHECK(onlyError(c) == "logging.options.text.splitStream: Forbidden: Feature LoggingAlphaOptions is disabled "
                        "(flag --log-text-split-stream)");
  c.featureGates = {{"LoggingAlphaOptions", true}};
  CHECK(validationErrors(c, kModes).empty());
}

TEST_CASE("--profiling / enableProfiling true is accepted (it serves /debug/flags/v)", "[unit]") {
  ProxyConfig c = valid();
  c.enableProfiling = true;
  CHECK(validationErrors(c, kModes).empty());
}
