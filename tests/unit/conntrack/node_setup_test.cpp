#include "node_setup.h"

#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>

using namespace kproxy::cli;

namespace {

std::vector<std::string> paths(const std::vector<SysctlSetting>& settings) {
  std::vector<std::string> out;
  for (const auto& s : settings) out.push_back(s.path + "=" + std::to_string(s.value));
  return out;
}

}  // namespace

TEST_CASE("--init-only's mode sysctls are upstream proxiers' initOnly settings", "[unit]") {
  ProxyConfig c;  // iptables, NodePorts on every local address
  CHECK(paths(modeSysctls(c, "6.1.0")) == std::vector<std::string>{"net/ipv4/conf/all/route_localnet=1"});
  c.iptables.localhostNodePorts = false;
  CHECK(modeSysctls(c, "6.1.0").empty());
  c.iptables.localhostNodePorts = true;
  c.nodePortAddresses = {"192.168.0.0/16"};  // no loopback among them
  CHECK(modeSysctls(c, "6.1.0").empty());
  c.nodePortAddresses = {"192.168.0.0/16", "127.0.0.0/8"};
  CHECK(modeSysctls(c, "6.1.0").size() == 1);
  c.nodePortAddresses = {"primary"};
  CHECK(modeSysctls(c, "6.1.0").empty());

  ProxyConfig ipvs;
  ipvs.mode = "ipvs";
  CHECK(paths(modeSysctls(ipvs, "6.1.0")) ==
        std::vector<std::string>{"net/ipv4/vs/conntrack=1", "net/ipv4/vs/expire_nodest_conn=1",
                                 "net/ipv4/vs/expire_quiescent_template=1"});
  ipvs.ipvs.strictARP = true;
  CHECK(paths(modeSysctls(ipvs, "5.4.0-150-generic")) ==
        std::vector<std::string>{"net/ipv4/vs/conntrack=1", "net/ipv4/vs/conn_reuse_mode=0",
                                 "net/ipv4/vs/expire_nodest_conn=1", "net/ipv4/vs/expire_quiescent_template=1",
                                 "net/ipv4/conf/all/arp_ignore=1", "net/ipv4/conf/all/arp_announce=2"});

  ProxyConfig nftables;
  nftables.mode = "nftables";
  CHECK(modeSysctls(nftables, "6.1.0").empty());
}

TEST_CASE("setUpNode writes the mode's sysctls under the given root, and a missing one is an error", "[unit]") {
  const auto root = std::filesystem::temp_directory_path() / "kproxy-node-setup-test";
  std::filesystem::remove_all(root);
  std::filesystem::create_directories(root / "net/ipv4/conf/all");
  std::ofstream(root / "net/ipv4/conf/all/route_localnet") << "0\n";
  SysctlRoots roots;
  roots.procSys = root;
  roots.moduleParameters = root / "module";
  ProxyConfig c;
  c.conntrack.maxPerCore = 0;  // no conntrack files here: warnings only
  c.conntrack.tcpEstablishedTimeout = c.conntrack.tcpCloseWaitTimeout = {};
  REQUIRE(setUpNode(c, roots).has_value());
  std::ifstream in(root / "net/ipv4/conf/all/route_localnet");
  std::string value;
  std::getline(in, value);
  CHECK(value == "1");

  c.mode = "ipvs";  // net/ipv4/vs is missing: IPVS is not loaded
  auto r = setUpNode(c, roots);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().message().find("net/ipv4/vs/conntrack") != std::string::npos);
  std::filesystem::remove_all(root);
}

TEST_CASE("applyOomScoreAdj writes the value, within upstream's range only", "[unit]") {
  const auto file = std::filesystem::temp_directory_path() / "kproxy-oom-score-adj-test";
  std::ofstream(file) << "0\n";
  REQUIRE(applyOomScoreAdj(-999, file.string()).has_value());
  std::ifstream in(file);
  std::string value;
  std::getline(in, value);
  CHECK(value == "-999");
  CHECK_FALSE(applyOomScoreAdj(1001, file.string()).has_value());
  std::filesystem::remove(file);
  CHECK_FALSE(applyOomScoreAdj(5, file.string()).has_value());  // never creates the file
}
