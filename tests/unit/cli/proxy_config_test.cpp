#include "proxy_config.h"

#include <catch2/catch.hpp>

using namespace kproxy::cli;
using namespace std::chrono_literals;

TEST_CASE("ProxyConfig defaults are kube-proxy's, with iptables as the mode as upstream on Linux", "[unit]") {
  const ProxyConfig c;
  CHECK(c.mode == "iptables");
  CHECK(c.bindAddress == "0.0.0.0");
  CHECK(c.healthzBindAddress == "0.0.0.0:10256");
  CHECK(c.metricsBindAddress == "127.0.0.1:10249");
  CHECK(c.clusterCIDR.empty());
  CHECK(c.hostnameOverride.empty());
  CHECK_FALSE(c.masqueradeAll);
  CHECK(c.nodePortAddresses.empty());
  CHECK(c.iptables.syncPeriod == 30s);
  CHECK(c.iptables.minSyncPeriod == 1s);
  CHECK(c.iptables.masqueradeBit == 14);
  CHECK(c.iptables.localhostNodePorts);
  CHECK(c.nftables.syncPeriod == 30s);
  CHECK(c.nftables.minSyncPeriod == 1s);
  CHECK(c.nftables.masqueradeBit == 14);
  CHECK(c.ipvs.syncPeriod == 30s);
  CHECK(c.ipvs.minSyncPeriod == 0s);
  CHECK(c.ipvs.scheduler.empty());
  CHECK(c.ipvs.excludeCIDRs.empty());
  CHECK_FALSE(c.ipvs.strictARP);
  CHECK(c.ipvs.tcpTimeout == 0s);
  CHECK(c.conntrack.maxPerCore == 32768);
  CHECK(c.conntrack.min == 131072);
  CHECK(c.conntrack.tcpEstablishedTimeout == 24h);
  CHECK(c.conntrack.tcpCloseWaitTimeout == 1h);
  CHECK_FALSE(c.conntrack.tcpBeLiberal);
  CHECK(c.conntrack.udpTimeout == 0s);
  CHECK(c.conntrack.udpStreamTimeout == 0s);
  CHECK(c.clientConnection.kubeconfig.empty());
  CHECK(c.clientConnection.qps == 5.0f);
  CHECK(c.clientConnection.burst == 10);
  CHECK(c.clientConnection.contentType == "application/vnd.kubernetes.protobuf");
  CHECK(c.oomScoreAdj == -999);
  CHECK(c.configSyncPeriod == 15min);
  CHECK(c.featureGates.empty());
  CHECK(c.logging.verbosity == 0);
  CHECK(c.pluginDirs.empty());
  CHECK_FALSE(c.dryRun);
  CHECK_FALSE(c.cleanup);
}

TEST_CASE("applyPlatformDefaults fills mode-dependent defaults as upstream does", "[unit]") {
  ProxyConfig c;
  c.mode.clear();
  applyPlatformDefaults(c);
  CHECK(c.mode == "iptables");  // an empty mode is iptables, as upstream's on Linux
  CHECK(c.detectLocalMode == "ClusterCIDR");
  CHECK(c.nodePortAddresses.empty());  // every local IP: iptables mode's default

  ProxyConfig nftables;
  nftables.mode = "nftables";
  applyPlatformDefaults(nftables);
  CHECK(nftables.nodePortAddresses == std::vector<std::string>{"primary"});
  applyPlatformDefaults(nftables);  // idempotent
  CHECK(nftables.nodePortAddresses == std::vector<std::string>{"primary"});

  ProxyConfig iptables;
  iptables.mode = "iptables";
  applyPlatformDefaults(iptables);
  CHECK(iptables.nodePortAddresses.empty());  // all local IPs in iptables mode

  ProxyConfig explicitList;
  explicitList.nodePortAddresses = {"10.0.0.0/8"};
  explicitList.detectLocalMode = "NodeCIDR";
  applyPlatformDefaults(explicitList);
  CHECK(explicitList.nodePortAddresses == std::vector<std::string>{"10.0.0.0/8"});
  CHECK(explicitList.detectLocalMode == "NodeCIDR");
}

TEST_CASE("effective sync periods come from the selected mode's section", "[unit]") {
  ProxyConfig c;
  c.iptables.syncPeriod = 11s;
  c.iptables.minSyncPeriod = 2s;
  c.nftables.syncPeriod = 12s;
  c.nftables.minSyncPeriod = 3s;
  c.ipvs.syncPeriod = 13s;
  c.ipvs.minSyncPeriod = 4s;
  c.mode = "nftables";
  CHECK(c.effectiveSyncPeriod() == 12s);
  CHECK(c.effectiveMinSyncPeriod() == 3s);
  c.mode = "ipvs";
  CHECK(c.effectiveSyncPeriod() == 13s);
  CHECK(c.effectiveMinSyncPeriod() == 4s);
  c.mode = "iptables";
  CHECK(c.effectiveSyncPeriod() == 11s);
  c.mode = "third-party";  // other plugins get the iptables section, like upstream's default
  CHECK(c.effectiveMinSyncPeriod() == 2s);
}

TEST_CASE("appendPortIfNeeded adds the port only to bare IPs", "[unit]") {
  CHECK(appendPortIfNeeded("0.0.0.0", 10256) == "0.0.0.0:10256");
  CHECK(appendPortIfNeeded("::1", 10249) == "[::1]:10249");
  CHECK(appendPortIfNeeded("127.0.0.1:9000", 10249) == "127.0.0.1:9000");
  CHECK(appendPortIfNeeded("[::]:9000", 10249) == "[::]:9000");
  CHECK(appendPortIfNeeded("", 10249).empty());
  CHECK(appendPortIfNeeded("not-an-ip", 10249) == "not-an-ip");
}
