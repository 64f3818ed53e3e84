// The conntrack sysctls kproxy sets at start-up: what is computed from the configuration, and
// how it is written, against a temporary directory standing in for /proc/sys and /sys.

#include <unistd.h>

#include <catch2/catch.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>

#include "conntrack_sysctls.h"

using namespace kproxy::cli;
using namespace std::chrono_literals;

namespace {

struct TempRoots {
  TempRoots() {
    std::string pattern = (std::filesystem::temp_directory_path() / "kproxy-sysctl-XXXXXX").string();
    REQUIRE(::mkdtemp(pattern.data()) != nullptr);
    base = pattern;
    roots.procSys = base / "proc-sys";
    roots.moduleParameters = base / "sys-module-nf_conntrack-parameters";
    std::filesystem::create_directories(roots.procSys / "net/netfilter");
    std::filesystem::create_directories(roots.moduleParameters);
  }
  ~TempRoots() {
    std::error_code ec;
    std::filesystem::remove_all(base, ec);
  }
  std::filesystem::path netfilter(const std::string& name) const { return roots.procSys / "net/netfilter" / name; }
  void put(const std::filesystem::path& file, const std::string& text) const { std::ofstream(file) << text; }
  std::string get(const std::filesystem::path& file) const {
    std::ifstream in(file);
    std::string text;
    std::getline(in, text);
    return text;
  }
  std::filesystem::path base;
  SysctlRoots roots;
};

ConntrackConfig noTimeouts() {
  ConntrackConfig c;
  c.tcpEstablishedTimeout = 0s;
  c.tcpCloseWaitTimeout = 0s;
  return c;
}

}  // namespace

TEST_CASE("nf_conntrack_max is maxPerCore times the cores, never below min, untouched when maxPerCore is 0",
          "[unit]") {
  ConntrackConfig c;  // upstream defaults: 32768 per core, min 131072
  CHECK(conntrackMax(c, 2) == 131072);
  CHECK(conntrackMax(c, 4) == 131072);
  CHECK(conntrackMax(c, 8) == 262144);
  c.min = 0;
  CHECK(conntrackMax(c, 2) == 65536);
  c.maxPerCore = 0;
  c.min = 131072;
  CHECK(conntrackMax(c, 64) == 0);
}

TEST_CASE("the default configuration sets the maximum and the two TCP timeouts only", "[unit]") {
  ConntrackConfig c;
  auto s = conntrackSysctls(c, 8);
  CHECK(s == std::vector<SysctlSetting>{{"net/netfilter/nf_conntrack_max", 262144},
                                        {"net/netfilter/nf_conntrack_tcp_timeout_established", 86400},
                                        {"net/netfilter/nf_conntrack_tcp_timeout_close_wait", 3600}});
}

TEST_CASE("tcpBeLiberal and the UDP timeouts are set when asked for, in whole seconds", "[unit]") {
  ConntrackConfig c = noTimeouts();
  c.maxPerCore = 0;
  c.tcpBeLiberal = true;
  c.udpTimeout = 1500ms;  // truncated like Go's int(d / time.Second)
  c.udpStreamTimeout = 2min;
  CHECK(conntrackSysctls(c, 4) == std::vector<SysctlSetting>{{"net/netfilter/nf_conntrack_tcp_be_liberal", 1},
                                                             {"net/netfilter/nf_conntrack_udp_timeout", 1},
                                                             {"net/netfilter/nf_conntrack_udp_timeout_stream", 120}});
  c.tcpBeLiberal = false;
  c.udpTimeout = 500ms;  // rounds to 0: left alone
  c.udpStreamTimeout = 0s;
  CHECK(conntrackSysctls(c, 4).empty());
}

TEST_CASE("values are written to the sysctl files, equal ones are left, hashsize grows to max/4", "[unit]") {
  TempRoots t;
  t.put(t.netfilter("nf_conntrack_max"), "65536\n");
  t.put(t.netfilter("nf_conntrack_tcp_timeout_established"), "432000\n");
  t.put(t.netfilter("nf_conntrack_tcp_timeout_close_wait"), "3600\n");
  t.put(t.roots.moduleParameters / "hashsize", "16384\n");
  ConntrackConfig c;

  auto outcomes = applyConntrackSysctls(c, 8, t.roots);
  REQUIRE(outcomes.has_value());
  REQUIRE(outcomes->size() == 4);
  CHECK((*outcomes)[0].status == SysctlStatus::kSet);
  CHECK((*outcomes)[0].previous == 65536);
  CHECK((*outcomes)[1].file == (t.roots.moduleParameters / "hashsize").string());
  CHECK((*outcomes)[1].status == SysctlStatus::kSet);
  CHECK((*outcomes)[2].status == SysctlStatus::kSet);
  CHECK((*outcomes)[3].status == SysctlStatus::kUnchanged);
  CHECK(t.get(t.netfilter("nf_conntrack_max")) == "262144");
  CHECK(t.get(t.roots.moduleParameters / "hashsize") == "65536");
  CHECK(t.get(t.netfilter("nf_conntrack_tcp_timeout_established")) == "86400");
  CHECK(t.get(t.netfilter("nf_conntrack_tcp_timeout_close_wait")) == "3600");

  // A second start-up changes nothing.
  auto again = applyConntrackSysctls(c, 8, t.roots);
  REQUIRE(again.has_value());
  REQUIRE(again->size() == 3);  // hashsize is big enough now: not even considered
  for (const auto& o : *again) CHECK(o.status == SysctlStatus::kUnchanged);
}

TEST_CASE("hashsize is never shrunk", "[unit]") {
  TempRoots t;
  t.put(t.netfilter("nf_conntrack_max"), "1\n");
  t.put(t.roots.moduleParameters / "hashsize", "1048576\n");
  auto outcomes = applyConntrackSysctls(noTimeouts(), 2, t.roots);
  REQUIRE(outcomes.has_value());
  REQUIRE(outcomes->size() == 1);
  CHECK(t.get(t.roots.moduleParameters / "hashsize") == "1048576");
  CHECK(t.get(t.netfilter("nf_conntrack_max")) == "131072");
}

TEST_CASE("a missing sysctl is reported and not created; other sysctls are still set", "[unit]") {
  TempRoots t;
  t.put(t.netfilter("nf_conntrack_tcp_timeout_established"), "432000\n");
  t.put(t.netfilter("nf_conntrack_tcp_timeout_close_wait"), "60\n");
  ConntrackConfig c;
  auto outcomes = applyConntrackSysctls(c, 2, t.roots);
  REQUIRE(outcomes.has_value());
  REQUIRE(outcomes->size() == 3);
  CHECK((*outcomes)[0].status == SysctlStatus::kMissing);
  CHECK((*outcomes)[0].previous == -1);
  CHECK_FALSE(std::filesystem::exists(t.netfilter("nf_conntrack_max")));
  CHECK((*outcomes)[1].status == SysctlStatus::kSet);
  CHECK((*outcomes)[2].status == SysctlStatus::kSet);
  CHECK(t.get(t.netfilter("nf_conntrack_tcp_timeout_close_wait")) == "3600");
}

TEST_CASE("a write refused for another reason than read-only is an error", "[unit]") {
  TempRoots t;
  // A directory where the file should be: EISDIR, not a read-only sysctl.
  std::filesystem::create_directories(t.netfilter("nf_conntrack_tcp_timeout_established"));
  ConntrackConfig c = noTimeouts();
  c.maxPerCore = 0;
  c.tcpEstablishedTimeout = 24h;
  auto failed = applyConntrackSysctls(c, 2, t.roots);
  REQUIRE_FALSE(failed.has_value());
  CHECK_THAT(failed.error().message(), Catch::Contains("nf_conntrack_tcp_timeout_established"));
}
