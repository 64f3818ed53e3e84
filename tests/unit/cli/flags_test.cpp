#include "flags.h"

#include <catch2/catch.hpp>
#include <vector>

#include "test_util.h"

using namespace kproxy::cli;
using kproxy::cli::test::TempFile;
using namespace std::chrono_literals;

namespace {

kproxy::core::Result<ParsedFlags> parse(std::vector<const char*> args) {
  return parseFlags(std::span<const char* const>(args.data(), args.size()));
}

ParsedFlags parseOk(std::vector<const char*> args) {
  auto r = parse(std::move(args));
  if (!r) FAIL(r.error().message());
  return *r;
}

std::string parseError(std::vector<const char*> args) {
  auto r = parse(std::move(args));
  REQUIRE_FALSE(r.has_value());
  return r.error().message();
}

ProxyConfig effective(std::vector<const char*> args) {
  auto flags = parseOk(std::move(args));
  auto r = effectiveConfig(flags);
  if (!r) FAIL(r.error().message());
  return *r;
}

}  // namespace

TEST_CASE("no flags give the defaults", "[unit]") {
  auto f = parseOk({});
  const ProxyConfig defaults;
  CHECK(f.config == defaults);
  CHECK(f.explicitlySet.empty());
  CHECK(f.configFile.empty());
}

TEST_CASE("string flags take --flag=value and --flag value", "[unit]") {
  auto a = parseOk({"--proxy-mode=iptables", "--kubeconfig", "/etc/kube.conf", "--master=https://k:6443"});
  CHECK(a.config.mode == "iptables");
  CHECK(a.config.clientConnection.kubeconfig == "/etc/kube.conf");
  CHECK(a.config.master == "https://k:6443");
  CHECK(a.isSet("proxy-mode"));
  CHECK(a.isSet("kubeconfig"));
  CHECK(a.isSet("master"));
  CHECK_FALSE(a.isSet("cluster-cidr"));

  // The separate value is taken as is, even when it starts with a dash (pflag does the same).
  auto b = parseOk({"--hostname-override", "-odd"});
  CHECK(b.config.hostnameOverride == "-odd");
  // "--flag=" is an explicit empty value.
  auto c = parseOk({"--metrics-bind-address="});
  CHECK(c.config.metricsBindAddress.empty());
  CHECK(c.isSet("metrics-bind-address"));
}

TEST_CASE("bool flags take --flag and --flag=true|false", "[unit]") {
  auto a = parseOk({"--masquerade-all", "--cleanup=true", "--dry-run=false", "--ipvs-strict-arp=1",
                    "--iptables-localhost-nodeports=F"});
  CHECK(a.config.masqueradeAll);
  CHECK(a.config.cleanup);
  CHECK_FALSE(a.config.dryRun);
  CHECK(a.isSet("dry-run"));
  CHECK(a.config.ipvs.strictARP);
  CHECK_FALSE(a.config.iptables.localhostNodePorts);
  // As in pflag, a bool flag does not consume the next argument.
  CHECK(parseError({"--cleanup", "false"}) == "unexpected argument \"false\"");
  CHECK(parseError({"--cleanup=maybe"}) ==
        "invalid value \"maybe\" for flag --cleanup: must be true or false");
}

TEST_CASE("verbosity takes -v N, -v=N, -vN, --v=N and --v N", "[unit]") {
  CHECK(parseOk({"-v", "3"}).config.logging.verbosity == 3);
  CHECK(parseOk({"-v=4"}).config.logging.verbosity == 4);
  CHECK(parseOk({"-v5"}).config.logging.verbosity == 5);
  CHECK(parseOk({"--v=6"}).config.logging.verbosity == 6);
  CHECK(parseOk({"--v", "7"}).config.logging.verbosity == 7);
  CHECK(parseOk({"-v", "2"}).isSet("v"));
  CHECK(parseError({"-v", "x"}) == "invalid value \"x\" for flag -v: must be a non-negative integer");
  CHECK(parseError({"-v"}) == "flag needs an argument: -v");
}

TEST_CASE("help and version", "[unit]") {
  CHECK(parseOk({"-h"}).config.showHelp);
  CHECK(parseOk({"--help"}).config.showHelp);
  CHECK(parseOk({"--version"}).config.showVersion);
}

TEST_CASE("durations in flags use Go syntax", "[unit]") {
  auto f = parseOk({"--iptables-sync-period=1m30s", "--iptables-min-sync-period", "500ms",
                    "--ipvs-sync-period=2h", "--ipvs-min-sync-period=0", "--config-sync-period=5m",
                    "--conntrack-tcp-timeout-established=12h",
                    "--conntrack-tcp-timeout-close-wait=30m", "--conntrack-udp-timeout=30s",
                    "--conntrack-udp-timeout-stream=2m", "--ipvs-tcp-timeout=1s",
                    "--ipvs-tcpfin-timeout=2s", "--ipvs-udp-timeout=3s"});
  const auto& c = f.config;
  CHECK(c.iptables.syncPeriod == 90s);
  CHECK(c.nftables.syncPeriod == 90s);  // upstream: the iptables flags apply to nftables mode
  CHECK(c.iptables.minSyncPeriod == 500ms);
  CHECK(c.nftables.minSyncPeriod == 500ms);
  CHECK(c.ipvs.syncPeriod == 2h);
  CHECK(c.ipvs.minSyncPeriod == 0s);
  CHECK(c.configSyncPeriod == 5min);
  CHECK(c.conntrack.tcpEstablishedTimeout == 12h);
  CHECK(c.conntrack.tcpCloseWaitTimeout == 30min);
  CHECK(c.conntrack.udpTimeout == 30s);
  CHECK(c.conntrack.udpStreamTimeout == 2min);
  CHECK(c.ipvs.tcpTimeout == 1s);
  CHECK(c.ipvs.tcpFinTimeout == 2s);
  CHECK(c.ipvs.udpTimeout == 3s);
  CHECK(parseError({"--iptables-sync-period=30"}) ==
        "invalid value \"30\" for flag --iptables-sync-period: missing unit (one of ns, us, ms, s, "
        "m, h) (examples: 30s, 1m30s, 500ms, 2h)");
  CHECK(parseError({"--config-sync-period", "soon"}).starts_with(
      "invalid value \"soon\" for flag --config-sync-period: "));
}

TEST_CASE("numeric, list and map flags", "[unit]") {
  auto f = parseOk({"--iptables-masquerade-bit=15", "--conntrack-max-per-core", "0",
                    "--conntrack-min=1000", "--oom-score-adj=-500", "--kube-api-qps=20.5",
                    "--kube-api-burst=40", "--nodeport-addresses=10.0.0.0/8,192.168.0.0/16",
                    "--nodeport-addresses", "fd00::/64", "--ipvs-exclude-cidrs=10.1.0.0/16",
                    "--feature-gates=A=true,B=false", "--feature-gates=A=false,C=true",
                    "--cluster-cidr=10.244.0.0/16,fd00:10:244::/56"});
  const auto& c = f.config;
  CHECK(c.iptables.masqueradeBit == 15);
  CHECK(c.nftables.masqueradeBit == 15);
  CHECK(c.conntrack.maxPerCore == 0);
  CHECK(c.conntrack.min == 1000);
  CHECK(c.oomScoreAdj == -500);
  CHECK(c.clientConnection.qps == 20.5f);
  CHECK(c.clientConnection.burst == 40);
  CHECK(c.nodePortAddresses == std::vector<std::string>{"10.0.0.0/8", "192.168.0.0/16", "fd00::/64"});
  CHECK(c.ipvs.excludeCIDRs == std::vector<std::string>{"10.1.0.0/16"});
  CHECK(c.featureGates == std::map<std::string, bool>{{"A", false}, {"B", false}, {"C", true}});
  CHECK(c.clusterCIDR == "10.244.0.0/16,fd00:10:244::/56");

  CHECK(parseError({"--conntrack-min=lots"}) ==
        "invalid value \"lots\" for flag --conntrack-min: must be a 32-bit integer");
  CHECK(parseError({"--oom-score-adj=99999999999"}) ==
        "invalid value \"99999999999\" for flag --oom-score-adj: must be a 32-bit integer");
  CHECK(parseError({"--feature-gates=Foo"}) ==
        "invalid value \"Foo\" for flag --feature-gates: missing bool value for Foo");
  CHECK(parseError({"--kube-api-qps=fast"}) ==
        "invalid value \"fast\" for flag --kube-api-qps: must be a number");
}

TEST_CASE("address flags are checked and get their default port", "[unit]") {
  auto f = parseOk({"--healthz-bind-address=127.0.0.1", "--metrics-bind-address=[::1]:9999",
                    "--bind-address=10.0.0.5"});
  CHECK(f.config.healthzBindAddress == "127.0.0.1:10256");
  CHECK(f.config.metricsBindAddress == "[::1]:9999");
  CHECK(f.config.bindAddress == "10.0.0.5");
  CHECK(parseError({"--bind-address=node1"}) ==
        "invalid value \"node1\" for flag --bind-address: must be an IP address");
  CHECK(parseError({"--healthz-bind-address=localhost:80"}) ==
        "invalid value \"localhost:80\" for flag --healthz-bind-address: must be IP or IP:port");
}

TEST_CASE("kproxy's own flags", "[unit]") {
  auto f = parseOk({"--manifests", "/srv/manifests", "--plugin-dir=/a", "--plugin-dir", "/b",
                    "--dry-run", "--write-config-to=/tmp/out.yaml", "--config", "/etc/kp.yaml"});
  CHECK(f.config.manifestsDir == "/srv/manifests");
  CHECK(f.config.pluginDirs == std::vector<std::string>{"/a", "/b"});
  CHECK(f.config.dryRun);
  CHECK(f.writeConfigTo == "/tmp/out.yaml");
  CHECK(f.configFile == "/etc/kp.yaml");
  CHECK_FALSE(f.config.allowHttpCredentials);
  CHECK(parseOk({"--insecure-allow-http-credentials"}).config.allowHttpCredentials);
  CHECK(parseError({"--plugin-dir="}) == "invalid value \"\" for flag --plugin-dir: must not be empty");
}

TEST_CASE("flag syntax errors are one clear line", "[unit]") {
  CHECK(parseError({"--foo"}) == "unknown flag: --foo");
  CHECK(parseError({"--foo=bar"}) == "unknown flag: --foo");
  CHECK(parseError({"-x"}) == "unknown flag: -x");
  CHECK(parseError({"-config=/x"}) == "unknown flag: -config");
  CHECK(parseError({"-hv"}) == "unknown flag: -hv");
  CHECK(parseError({"--config"}) == "flag needs an argument: --config");
  CHECK(parseError({"stray"}) == "unexpected argument \"stray\"");
  CHECK(parseError({"--", "stray"}) == "unexpected argument \"stray\"");
  CHECK(parseOk({"--dry-run", "--"}).config.dryRun);
}

TEST_CASE("the last value of a repeated scalar flag wins", "[unit]") {
  CHECK(parseOk({"--proxy-mode=ipvs", "--proxy-mode=iptables"}).config.mode == "iptables");
}

TEST_CASE("without --config the flags override the defaults", "[unit]") {
  auto c = effective({"--proxy-mode=iptables", "--iptables-sync-period=10s",
                      "--hostname-override=  Node-A  "});
  CHECK(c.mode == "iptables");
  CHECK(c.effectiveSyncPeriod() == 10s);
  CHECK(c.hostnameOverride == "node-a");  // trimmed and lower-cased, as upstream
  CHECK(c.detectLocalMode == "ClusterCIDR");
  CHECK(c.nodePortAddresses.empty());

  auto d = effective({});
  CHECK(d.mode == "iptables");  // upstream's default on Linux
  CHECK(d.nodePortAddresses.empty());
  auto e = effective({"--proxy-mode="});
  CHECK(e.mode == "iptables");  // an empty mode too

  auto n = effective({"--proxy-mode=nftables"});
  CHECK(n.nodePortAddresses == std::vector<std::string>{"primary"});
}

TEST_CASE("a blank --hostname-override is an error", "[unit]") {
  auto flags = parseOk({"--hostname-override=   "});
  auto r = effectiveConfig(flags);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().message() == "invalid value \"   \" for flag --hostname-override: must not be blank");
}

TEST_CASE("with --config the file replaces the configuration flags, as upstream", "[unit]") {
  TempFile file(R"(apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
hostnameOverride: from-file
clusterCIDR: 10.244.0.0/16
iptables:
  syncPeriod: 45s
logging:
  verbosity: 2
)");
  auto flags = parseOk({"--config", file.path().c_str(), "--proxy-mode=ipvs",
                        "--iptables-sync-period=5s", "--cluster-cidr=10.0.0.0/8",
                        "--masquerade-all", "--master=https://api:6443", "--manifests=/m",
                        "--plugin-dir=/p", "--dry-run", "--insecure-allow-http-credentials",
                        "--iptables-variant=legacy", "--udp-timeout=2s", "--verify-period=30s"});
  auto r = effectiveConfig(flags);
  REQUIRE(r.has_value());
  const auto& c = *r;
  // Configuration flags are ignored: the file's values (and upstream's defaults) stand.
  CHECK(c.mode == "iptables");
  CHECK(c.iptables.syncPeriod == 45s);
  CHECK(c.clusterCIDR == "10.244.0.0/16");
  CHECK_FALSE(c.masqueradeAll);
  CHECK(c.hostnameOverride == "from-file");
  CHECK(c.logging.verbosity == 2);
  // Process flags always apply.
  CHECK(c.master == "https://api:6443");
  CHECK(c.manifestsDir == "/m");
  CHECK(c.pluginDirs == std::vector<std::string>{"/p"});
  CHECK(c.dryRun);
  CHECK(c.allowHttpCredentials);
  CHECK(c.iptablesVariant == "legacy");
  CHECK(c.userspace.udpIdleTimeout == 2s);
  CHECK(c.verifyPeriod == 30s);
  CHECK(ignoredFlags(flags) == std::vector<std::string>{"--cluster-cidr", "--iptables-sync-period",
                                                         "--masquerade-all", "--proxy-mode"});
}

TEST_CASE("with --config, -v, --logging-format and --hostname-override still win", "[unit]") {
  TempFile file(R"(apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
hostnameOverride: from-file
logging:
  verbosity: 2
  format: text
)");
  const std::string configArg = "--config=" + file.path();
  auto c = effective({configArg.c_str()});
  CHECK(c.logging.verbosity == 2);
  CHECK(c.hostnameOverride == "from-file");

  const std::string& arg = configArg;
  auto d = effective({arg.c_str(), "-v=6", "--hostname-override=Other", "--logging-format=json"});
  CHECK(d.logging.verbosity == 6);
  CHECK(d.logging.format == "json");
  CHECK(d.hostnameOverride == "other");
  CHECK(ignoredFlags(parseOk({arg.c_str(), "-v=6", "--hostname-override=x"})).empty());
}

TEST_CASE("ignoredFlags is empty without --config", "[unit]") {
  CHECK(ignoredFlags(parseOk({"--proxy-mode=ipvs"})).empty());
}

TEST_CASE("a --config file that cannot be read or decoded is an error naming it", "[unit]") {
  auto missing = effectiveConfig(parseOk({"--config=/nonexistent/kproxy.yaml"}));
  REQUIRE_FALSE(missing.has_value());
  CHECK(missing.error().message().find("/nonexistent/kproxy.yaml") != std::string::npos);

  TempFile bad("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: [x]\n");
  auto r = effectiveConfig(parseOk({"--config", bad.path().c_str()}));
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().message() == bad.path() + ": mode: must be a string, got a list");
}

TEST_CASE("usage lists every flag", "[unit]") {
  const std::string text = usage();
  for (const char* flag :
       {"--proxy-mode", "--config", "--kubeconfig", "--master", "--hostname-override",
        "--cluster-cidr", "--masquerade-all", "--nodeport-addresses", "--metrics-bind-address",
        "--healthz-bind-address", "--bind-address", "--iptables-sync-period",
        "--iptables-min-sync-period", "--iptables-masquerade-bit", "--ipvs-scheduler",
        "--ipvs-sync-period", "--ipvs-min-sync-period", "--conntrack-max-per-core",
        "--conntrack-min", "--conntrack-tcp-timeout-established",
        "--conntrack-tcp-timeout-close-wait", "--cleanup", "-v, --v", "--feature-gates",
        "--config-sync-period", "--oom-score-adj", "--write-config-to", "--version",
        "-h, --help", "--manifests", "--plugin-dir", "--dry-run",
        "--insecure-allow-http-credentials"}) {
    INFO(flag);
    CHECK(text.find(flag) != std::string::npos);
  }
  CHECK(text.find("(default 127.0.0.1:10249)") != std::string::npos);
}

TEST_CASE("underscores in flag names read as dashes, as upstream's flag set normalises them", "[unit]") {
  auto f = parseOk({"--iptables_sync_period=45s", "--proxy_mode", "ipvs", "--masquerade_all"});
  CHECK(f.config.iptables.syncPeriod == 45s);
  CHECK(f.config.mode == "ipvs");
  CHECK(f.config.masqueradeAll);
  CHECK(f.isSet("iptables-sync-period"));
  CHECK(flagTakesNextArgument("--proxy_mode"));
  CHECK(parseError({"--no_such_flag"}) == "unknown flag: --no_such_flag");
}

TEST_CASE("--healthz-port and --metrics-port: deprecated, and applied as upstream's addressFromDeprecatedFlags",
          "[unit]") {
  auto f = parseOk({"--healthz-port=0", "--metrics-port=9999", "--metrics-bind-address=127.0.0.2"});
  REQUIRE(f.warnings.size() == 2);
  CHECK(f.warnings[0] ==
        "Flag --healthz-port has been deprecated, This flag is deprecated and will be removed in a future "
        "release. Please use --healthz-bind-address instead.");
  auto c = effectiveConfig(f);
  REQUIRE(c);
  CHECK(c->healthzBindAddress.empty());  // port 0 disables the server
  CHECK(c->metricsBindAddress == "127.0.0.2:9999");
  // The defaults carry their port already, so a port alone changes nothing (as upstream).
  CHECK(effective({"--metrics-port=9999"}).metricsBindAddress == "127.0.0.1:10249");
  // With --write-config-to they are not applied (upstream's Complete).
  CHECK(effective({"--healthz-port=0", "--write-config-to=/dev/null"}).healthzBindAddress == "0.0.0.0:10256");
  CHECK(usage().find("--healthz-port") == std::string::npos);  // hidden, as pflag hides deprecated flags
}

TEST_CASE("logging flags: --vmodule, --log-flush-frequency, the split-stream and buffer-size flags", "[unit]") {
  auto f = parseOk({"--vmodule=proxier*=4,main=2", "--vmodule", "x=1", "--log-flush-frequency=2s",
                    "--log-text-split-stream", "--log-text-info-buffer-size=64Ki",
                    "--log-json-info-buffer-size=1M"});
  CHECK(f.config.logging.vmodule == std::vector<std::string>{"proxier*=4", "main=2", "x=1"});
  CHECK(f.config.logging.flushFrequency == 2s);
  CHECK(f.config.logging.textSplitStream);
  CHECK(f.config.logging.textInfoBufferSize == 64 * 1024);
  CHECK(f.config.logging.jsonInfoBufferSize == 1000000);
  CHECK(parseError({"--vmodule=proxier"}) ==
        "invalid value \"proxier\" for flag --vmodule: \"proxier\" does not have the pattern=N format");
  CHECK(parseError({"--log-text-info-buffer-size=1x"}).find("must be a quantity of bytes") != std::string::npos);
  // The logging flags win over the config file.
  TempFile file("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n");
  auto c = effective({"--config", file.path().c_str(), "--log-flush-frequency=3s", "--vmodule=a=1"});
  CHECK(c.logging.flushFrequency == 3s);
  CHECK(c.logging.vmodule == std::vector<std::string>{"a=1"});
}
