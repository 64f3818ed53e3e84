#include "config_file.h"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "flags.h"
#include "test_util.h"

using namespace kproxy::cli;
using kproxy::cli::test::TempFile;
using namespace std::chrono_literals;

namespace {

constexpr const char* kHeader =
    "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n";

ProxyConfig decodeOk(const std::string& text) {
  auto r = decodeConfig(text, "test.yaml");
  if (!r) FAIL(r.error().message());
  return *r;
}

std::string decodeError(const std::string& text) {
  auto r = decodeConfig(text, "test.yaml");
  REQUIRE_FALSE(r.has_value());
  return r.error().message();
}

}  // namespace

TEST_CASE("a minimal file gives upstream's defaults", "[unit]") {
  auto c = decodeOk(kHeader);
  ProxyConfig expected;
  expected.mode.clear();  // unset in the file; applyPlatformDefaults() picks iptables
  CHECK(c == expected);
  applyPlatformDefaults(c);
  CHECK(c.mode == "iptables");
  CHECK(c.nodePortAddresses.empty());
  // kubeadm's config.conf writes `mode: ""`: the same.
  auto empty = decodeOk(std::string(kHeader) + "mode: \"\"\n");
  applyPlatformDefaults(empty);
  CHECK(empty.mode == "iptables");
}

TEST_CASE("a YAML file sets every field by its upstream name", "[unit]") {
  auto c = decodeOk(std::string(kHeader) + R"(
mode: ipvs
bindAddress: 10.0.0.5
healthzBindAddress: 0.0.0.0:12345
metricsBindAddress: 10.0.0.5
bindAddressHardFail: true
enableProfiling: true
clusterCIDR: 10.244.0.0/16
hostnameOverride: node-1
nodePortAddresses: [10.0.0.0/8, "fd00::/64"]
detectLocalMode: BridgeInterface
detectLocal:
  bridgeInterface: cbr0
  interfaceNamePrefix: veth
oomScoreAdj: -100
configSyncPeriod: 1m
portRange: 30000-32767
featureGates:
  SomeGate: true
  OtherGate: false
clientConnection:
  kubeconfig: /var/lib/kube-proxy/kubeconfig
  acceptContentTypes: application/json
  contentType: application/json
  qps: 50
  burst: 100
iptables:
  masqueradeBit: 13
  masqueradeAll: true
  localhostNodePorts: false
  syncPeriod: 1m30s
  minSyncPeriod: 2s
nftables:
  masqueradeBit: 12
  syncPeriod: 20s
  minSyncPeriod: 500ms
ipvs:
  syncPeriod: 40s
  minSyncPeriod: 3s
  scheduler: wrr
  excludeCIDRs:
  - 10.1.0.0/16
  strictARP: true
  tcpTimeout: 900s
  tcpFinTimeout: 120s
  udpTimeout: 300s
conntrack:
  maxPerCore: 0
  min: 65536
  tcpEstablishedTimeout: 12h
  tcpCloseWaitTimeout: 30m
  tcpBeLiberal: true
  udpTimeout: 30s
  udpStreamTimeout: 2m
logging:
  verbosity: 4
  format: json
  flushFrequency: 10s
  options:
    json:
      infoBufferSize: "0"
winkernel:
  networkName: ""
)");
  CHECK(c.mode == "ipvs");
  CHECK(c.bindAddress == "10.0.0.5");
  CHECK(c.healthzBindAddress == "0.0.0.0:12345");
  CHECK(c.metricsBindAddress == "10.0.0.5:10249");  // port appended as upstream
  CHECK(c.bindAddressHardFail);
  CHECK(c.enableProfiling);
  CHECK(c.clusterCIDR == "10.244.0.0/16");
  CHECK(c.hostnameOverride == "node-1");
  CHECK(c.nodePortAddresses == std::vector<std::string>{"10.0.0.0/8", "fd00::/64"});
  CHECK(c.detectLocalMode == "BridgeInterface");
  CHECK(c.detectLocal.bridgeInterface == "cbr0");
  CHECK(c.detectLocal.interfaceNamePrefix == "veth");
  CHECK(c.oomScoreAdj == -100);
  CHECK(c.configSyncPeriod == 1min);
  CHECK(c.portRange == "30000-32767");
  CHECK(c.featureGates == std::map<std::string, bool>{{"OtherGate", false}, {"SomeGate", true}});
  CHECK(c.clientConnection.kubeconfig == "/var/lib/kube-proxy/kubeconfig");
  CHECK(c.clientConnection.acceptContentTypes == "application/json");
  CHECK(c.clientConnection.contentType == "application/json");
  CHECK(c.clientConnection.qps == 50.0f);
  CHECK(c.clientConnection.burst == 100);
  CHECK(c.iptables.masqueradeBit == 13);
  CHECK(c.masqueradeAll);  // ipvs mode reads iptables.masqueradeAll, as upstream
  CHECK_FALSE(c.iptables.localhostNodePorts);
  CHECK(c.iptables.syncPeriod == 90s);
  CHECK(c.iptables.minSyncPeriod == 2s);
  CHECK(c.nftables.masqueradeBit == 12);
  CHECK(c.nftables.syncPeriod == 20s);
  CHECK(c.nftables.minSyncPeriod == 500ms);
  CHECK(c.ipvs.syncPeriod == 40s);
  CHECK(c.ipvs.minSyncPeriod == 3s);
  CHECK(c.ipvs.scheduler == "wrr");
  CHECK(c.ipvs.excludeCIDRs == std::vector<std::string>{"10.1.0.0/16"});
  CHECK(c.ipvs.strictARP);
  CHECK(c.ipvs.tcpTimeout == 900s);
  CHECK(c.ipvs.tcpFinTimeout == 120s);
  CHECK(c.ipvs.udpTimeout == 300s);
  CHECK(c.conntrack.maxPerCore == 0);  // an explicit 0 is kept (upstream: pointer field)
  CHECK(c.conntrack.min == 65536);
  CHECK(c.conntrack.tcpEstablishedTimeout == 12h);
  CHECK(c.conntrack.tcpCloseWaitTimeout == 30min);
  CHECK(c.conntrack.tcpBeLiberal);
  CHECK(c.conntrack.udpTimeout == 30s);
  CHECK(c.conntrack.udpStreamTimeout == 2min);
  CHECK(c.logging.verbosity == 4);
  CHECK(c.logging.format == "json");
  CHECK(c.logging.flushFrequency == 10s);
  CHECK(c.effectiveSyncPeriod() == 40s);
}

TEST_CASE("a JSON file is read the same way", "[unit]") {
  auto c = decodeOk(R"({
    "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
    "kind": "KubeProxyConfiguration",
    "mode": "nftables",
    "clusterCIDR": "10.244.0.0/16",
    "nodePortAddresses": ["primary"],
    "nftables": {"masqueradeAll": true, "syncPeriod": "1m", "minSyncPeriod": "250ms", "masqueradeBit": 3},
    "conntrack": {"maxPerCore": 16384, "tcpBeLiberal": true},
    "clientConnection": {"kubeconfig": "/k", "qps": 7.5},
    "featureGates": {"X": true},
    "oomScoreAdj": null
  })");
  CHECK(c.mode == "nftables");
  CHECK(c.clusterCIDR == "10.244.0.0/16");
  CHECK(c.nodePortAddresses == std::vector<std::string>{"primary"});
  CHECK(c.masqueradeAll);  // nftables mode reads nftables.masqueradeAll
  CHECK(c.nftables.syncPeriod == 1min);
  CHECK(c.nftables.minSyncPeriod == 250ms);
  CHECK(c.nftables.masqueradeBit == 3);
  CHECK(c.conntrack.maxPerCore == 16384);
  CHECK(c.conntrack.min == 131072);
  CHECK(c.conntrack.tcpBeLiberal);
  CHECK(c.clientConnection.kubeconfig == "/k");
  CHECK(c.clientConnection.qps == 7.5f);
  CHECK(c.featureGates.at("X"));
  CHECK(c.oomScoreAdj == -999);  // null means unset
}

TEST_CASE("zero durations, QPS and burst take upstream's defaults", "[unit]") {
  // Go cannot tell a zero metav1.Duration from an absent one, so upstream defaults both.
  auto c = decodeOk(std::string(kHeader) +
                    "iptables: {syncPeriod: 0s, minSyncPeriod: 0s}\nconfigSyncPeriod: 0s\n"
                    "clientConnection: {qps: 0, burst: 0}\n");
  CHECK(c.iptables.syncPeriod == 30s);
  CHECK(c.iptables.minSyncPeriod == 1s);
  CHECK(c.configSyncPeriod == 15min);
  CHECK(c.clientConnection.qps == 5.0f);
  CHECK(c.clientConnection.burst == 10);
}

TEST_CASE("an IPv6 bindAddress makes IPv6 server defaults", "[unit]") {
  auto c = decodeOk(std::string(kHeader) + "bindAddress: \"::\"\n");
  CHECK(c.healthzBindAddress == "[::]:10256");
  CHECK(c.metricsBindAddress == "[::1]:10249");
}

TEST_CASE("apiVersion and kind are checked", "[unit]") {
  CHECK(decodeError("kind: KubeProxyConfiguration\nmode: iptables\n") ==
        "test.yaml: apiVersion is missing (want kubeproxy.config.k8s.io/v1alpha1)");
  CHECK(decodeError("apiVersion: kubeproxy.config.k8s.io/v1alpha1\n") ==
        "test.yaml: kind is missing (want KubeProxyConfiguration)");
  CHECK(decodeError("apiVersion: kubeproxy.config.k8s.io/v1beta1\nkind: KubeProxyConfiguration\n") ==
        "test.yaml: apiVersion \"kubeproxy.config.k8s.io/v1beta1\" is not supported (want "
        "kubeproxy.config.k8s.io/v1alpha1)");
  CHECK(decodeError("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeletConfiguration\n") ==
        "test.yaml: kind \"KubeletConfiguration\" is not supported (want KubeProxyConfiguration)");
}

TEST_CASE("decoding is strict about unknown and duplicate fields", "[unit]") {
  CHECK(decodeError(std::string(kHeader) + "masqueradeAll: true\n") ==
        "test.yaml: unknown field \"masqueradeAll\"");
  CHECK(decodeError(std::string(kHeader) + "iptables:\n  syncPeriodd: 30s\n") ==
        "test.yaml: unknown field \"iptables.syncPeriodd\"");
  CHECK(decodeError(std::string(kHeader) + "conntrack: {maxPerCore: 1, foo: 2}\n") ==
        "test.yaml: unknown field \"conntrack.foo\"");
  CHECK(decodeError(std::string(kHeader) + "mode: iptables\nmode: ipvs\n") ==
        "test.yaml: duplicate field \"mode\"");
}

TEST_CASE("wrong types are errors naming the field", "[unit]") {
  CHECK(decodeError(std::string(kHeader) + "mode: 5\n") == "test.yaml: mode: must be a string, got a number");
  CHECK(decodeError(std::string(kHeader) + "hostnameOverride: true\n") ==
        "test.yaml: hostnameOverride: must be a string, got a bool");
  CHECK(decodeError(std::string(kHeader) + "iptables:\n  masqueradeBit: \"14\"\n") ==
        "test.yaml: iptables.masqueradeBit: must be an integer, got a string");
  CHECK(decodeError(std::string(kHeader) + "iptables:\n  masqueradeBit: 1.5\n") ==
        "test.yaml: iptables.masqueradeBit: must be an integer, got a number");
  CHECK(decodeError(std::string(kHeader) + "conntrack:\n  min: 99999999999\n") ==
        "test.yaml: conntrack.min: 99999999999 is out of range for a 32-bit integer");
  CHECK(decodeError(std::string(kHeader) + "ipvs:\n  strictARP: maybe\n") ==
        "test.yaml: ipvs.strictARP: must be a bool, got a string");
  CHECK(decodeError(std::string(kHeader) + "nodePortAddresses: 10.0.0.0/8\n") ==
        "test.yaml: nodePortAddresses: must be a list of strings, got a string");
  CHECK(decodeError(std::string(kHeader) + "nodePortAddresses: [10.0.0.0/8, 5]\n") ==
        "test.yaml: nodePortAddresses[1]: must be a string, got a number");
  CHECK(decodeError(std::string(kHeader) + "iptables: 5\n") ==
        "test.yaml: iptables: must be an object, got a number");
  CHECK(decodeError(std::string(kHeader) + "featureGates:\n  A: yes-please\n") ==
        "test.yaml: featureGates.A: must be a bool, got a string");
  CHECK(decodeError(std::string(kHeader) + "clientConnection: {qps: fast}\n") ==
        "test.yaml: clientConnection.qps: must be a number, got a string");
  CHECK(decodeError(R"({"apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration", "oomScoreAdj": "-999"})") ==
        "test.yaml: oomScoreAdj: must be an integer, got a string");
  CHECK(decodeError("- a\n- b\n") == "test.yaml: must be a KubeProxyConfiguration object, got a list");
  CHECK(decodeError("") == "test.yaml: empty document");
}

TEST_CASE("bad durations are errors naming the field and value", "[unit]") {
  CHECK(decodeError(std::string(kHeader) + "iptables:\n  syncPeriod: 30\n") ==
        "test.yaml: iptables.syncPeriod: invalid duration \"30\": missing unit (one of ns, us, "
        "ms, s, m, h) (examples: 30s, 1m30s, 500ms, 2h)");
  CHECK(decodeError(std::string(kHeader) + "conntrack:\n  tcpCloseWaitTimeout: 1d\n") ==
        "test.yaml: conntrack.tcpCloseWaitTimeout: invalid duration \"1d\": unknown unit (one of "
        "ns, us, ms, s, m, h) (examples: 30s, 1m30s, 500ms, 2h)");
  CHECK(decodeError(std::string(kHeader) + "nftables:\n  minSyncPeriod: [1s]\n") ==
        "test.yaml: nftables.minSyncPeriod: must be a duration string such as \"30s\", got a list");
}

TEST_CASE("YAML syntax errors give the position", "[unit]") {
  const auto message = decodeError(std::string(kHeader) + "iptables: {syncPeriod: 30s\n");
  CHECK(message.starts_with("test.yaml: line "));
}

TEST_CASE("loadConfigFile names the path in errors", "[unit]") {
  TempFile file(std::string(kHeader) + "oomScoreAdj: [1]\n");
  auto r = loadConfigFile(file.path());
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().message() == file.path() + ": oomScoreAdj: must be an integer, got a list");
  auto missing = loadConfigFile("/nonexistent/kp.yaml");
  REQUIRE_FALSE(missing.has_value());
  CHECK(missing.error().message() ==
        "reading config file /nonexistent/kp.yaml: No such file or directory");
}

TEST_CASE("toJson writes upstream's camelCase v1alpha1 shape", "[unit]") {
  ProxyConfig c;
  c.mode = "iptables";
  c.masqueradeAll = true;
  c.clusterCIDR = "10.0.0.0/8";
  c.featureGates["G"] = true;
  c.master = "https://secret:6443";
  const auto j = nlohmann::json::parse(toJson(c));
  CHECK(j.at("apiVersion") == "kubeproxy.config.k8s.io/v1alpha1");
  CHECK(j.at("kind") == "KubeProxyConfiguration");
  CHECK(j.at("mode") == "iptables");
  CHECK(j.at("clusterCIDR") == "10.0.0.0/8");
  CHECK(j.at("metricsBindAddress") == "127.0.0.1:10249");
  CHECK(j.at("iptables").at("syncPeriod") == "30s");
  CHECK(j.at("iptables").at("masqueradeAll") == true);
  CHECK(j.at("iptables").at("masqueradeBit") == 14);
  CHECK(j.at("conntrack").at("tcpEstablishedTimeout") == "24h0m0s");
  CHECK(j.at("conntrack").at("maxPerCore") == 32768);
  CHECK(j.at("clientConnection").at("qps") == 5.0);
  CHECK(j.at("configSyncPeriod") == "15m0s");
  CHECK(j.at("featureGates").at("G") == true);
  CHECK(j.at("nodePortAddresses").is_null());
  CHECK_FALSE(j.contains("master"));  // process options are not configuration
  const auto z = nlohmann::json::parse(toConfigzJson(c));
  CHECK(z.at("kubeproxy.config.k8s.io") == j);
}

TEST_CASE("write-config round trip gives the same configuration", "[unit]") {
  ProxyConfig c;
  c.mode = "ipvs";
  c.bindAddress = "10.1.2.3";
  c.healthzBindAddress = "[::]:10256";
  c.metricsBindAddress = "";
  c.hostnameOverride = "123";  // a string that looks like a number must stay a string
  c.clusterCIDR = "10.244.0.0/16,fd00::/56";
  c.masqueradeAll = true;
  c.nodePortAddresses = {"10.0.0.0/8", "primary"};
  c.iptables.syncPeriod = 90s;
  c.iptables.minSyncPeriod = 1500ms;
  c.iptables.masqueradeBit = 0;
  c.iptables.localhostNodePorts = false;
  c.nftables.syncPeriod = 7s;
  c.ipvs.scheduler = "sh";
  c.ipvs.excludeCIDRs = {"10.9.0.0/16"};
  c.ipvs.minSyncPeriod = 2s;
  c.ipvs.strictARP = true;
  c.ipvs.tcpFinTimeout = 5s;
  c.conntrack.maxPerCore = 0;
  c.conntrack.min = 0;
  c.conntrack.tcpCloseWaitTimeout = 0s;
  c.conntrack.udpStreamTimeout = 3min;
  c.clientConnection.kubeconfig = "/etc/k config";
  c.clientConnection.qps = 12.25f;
  c.clientConnection.acceptContentTypes = "true";
  c.detectLocalMode = "InterfaceNamePrefix";
  c.detectLocal.interfaceNamePrefix = "veth";
  c.oomScoreAdj = 0;
  c.configSyncPeriod = 1h;
  c.portRange = "";
  c.featureGates = {{"A", true}, {"B", false}};
  c.logging.verbosity = 3;

  TempFile out("", ".yaml");
  REQUIRE(writeConfigFile(c, out.path()).has_value());
  const std::string text = kproxy::cli::test::readFile(out.path());
  INFO(text);
  CHECK(text.starts_with("apiVersion: kubeproxy.config.k8s.io/v1alpha1\n"));
  auto back = loadConfigFile(out.path());
  REQUIRE(back.has_value());
  // metricsBindAddress "" is not representable in the file (upstream defaults it); the rest is.
  ProxyConfig expected = c;
  expected.metricsBindAddress = "127.0.0.1:10249";
  CHECK(*back == expected);
  // And once more: a written default configuration reads back identically.
  ProxyConfig d;
  applyPlatformDefaults(d);
  auto again = decodeConfig(toYaml(d), "defaults");
  REQUIRE(again.has_value());
  CHECK(*again == d);
}

TEST_CASE("--write-config-to writes the effective configuration", "[unit]") {
  TempFile out("", ".yaml");
  const std::string arg = "--write-config-to=" + out.path();
  std::vector<const char*> args = {arg.c_str(), "--proxy-mode=iptables", "--cluster-cidr=10.0.0.0/16",
                                   "--iptables-sync-period=45s", "--masquerade-all"};
  auto flags = parseFlags(args);
  REQUIRE(flags.has_value());
  auto config = effectiveConfig(*flags);
  REQUIRE(config.has_value());
  REQUIRE(writeConfigFile(*config, flags->writeConfigTo).has_value());
  // The written file, given back with --config, yields the same configuration.
  const std::string configArg = "--config=" + out.path();
  std::vector<const char*> again = {configArg.c_str()};
  auto reread = effectiveConfig(*parseFlags(again));
  REQUIRE(reread.has_value());
  CHECK(*reread == *config);
  CHECK(reread->mode == "iptables");
  CHECK(reread->iptables.syncPeriod == 45s);
  CHECK(reread->masqueradeAll);
}

TEST_CASE("a config file with an unknown or duplicated field loads leniently, as upstream's loadConfig", "[unit]") {
  const std::string text = std::string(kHeader) + "mode: nftables\nnoSuchField: 1\niptables:\n  futureOption: x\n";
  CHECK(decodeError(text) == "test.yaml: unknown field \"noSuchField\"");  // strict
  auto lenient = decodeConfig(text, "test.yaml", Strictness::kLenient);
  REQUIRE(lenient);
  CHECK(lenient->mode == "nftables");
  TempFile file(text);
  auto loaded = loadConfigFile(file.path());
  REQUIRE(loaded);
  CHECK(loaded->mode == "nftables");
  // Duplicates: the last one, leniently.
  TempFile dup(std::string(kHeader) + "mode: ipvs\nmode: nftables\n");
  auto d = loadConfigFile(dup.path());
  REQUIRE(d);
  CHECK(d->mode == "nftables");
  // Other errors stay errors, with the strict message.
  TempFile bad(std::string(kHeader) + "oomScoreAdj: lots\nnoSuchField: 1\n");
  auto b = loadConfigFile(bad.path());
  REQUIRE_FALSE(b);
  CHECK(b.error().message().find("oomScoreAdj: must be an integer") != std::string::npos);
}
