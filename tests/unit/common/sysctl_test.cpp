#include "kproxy/backends/common/sysctl.h"

#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <cerrno>
#include <filesystem>
#include <fstream>

using kproxy::backends::SysctlFiles;
namespace fs = std::filesystem;

namespace {

/// A fresh directory standing in for /proc/sys, removed afterwards.
struct TempRoot {
  fs::path path;
  TempRoot() {
    std::string pattern = (fs::temp_directory_path() / "kproxy-sysctl-XXXXXX").string();
    path = ::mkdtemp(pattern.data());
  }
  ~TempRoot() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  void put(const std::string& name, const std::string& text) const {
    fs::create_directories((path / name).parent_path());
    std::ofstream(path / name) << text;
  }
  std::string get(const std::string& name) const {
    std::ifstream in(path / name);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
};

}  // namespace

TEST_CASE("values are read under the injected root", "[unit]") {
  TempRoot root;
  root.put("net/ipv4/ip_forward", "1\n");
  root.put("net/netfilter/nf_conntrack_max", "  262144 \n");
  root.put("net/ipv4/ip_local_port_range", "32768\t60999\n");
  SysctlFiles sysctls(root.path);
  CHECK(sysctls.pathOf("net/ipv4/ip_forward") == root.path / "net/ipv4/ip_forward");
  CHECK(sysctls.read("net/ipv4/ip_forward") == "1");
  CHECK(sysctls.readInt("net/ipv4/ip_forward") == 1);
  CHECK(sysctls.readInt("net/netfilter/nf_conntrack_max") == 262144);
  CHECK(sysctls.read("net/ipv4/ip_local_port_range") == "32768\t60999");
  auto notInt = sysctls.readInt("net/ipv4/ip_local_port_range");
  REQUIRE_FALSE(notInt);
  CHECK(notInt.error().category == kproxy::core::ErrorCategory::kDecode);
  auto missing = sysctls.read("net/ipv4/nope");
  REQUIRE_FALSE(missing);
  CHECK(missing.error().errnum == ENOENT);
}

TEST_CASE("values are written, never created", "[unit]") {
  TempRoot root;
  root.put("net/ipv4/conf/all/route_localnet", "0\n");
  SysctlFiles sysctls(root.path);
  REQUIRE(sysctls.writeInt("net/ipv4/conf/all/route_localnet", 1));
  CHECK(root.get("net/ipv4/conf/all/route_localnet") == "1\n");
  REQUIRE(sysctls.write("net/ipv4/conf/all/route_localnet", "0"));
  CHECK(sysctls.readInt("net/ipv4/conf/all/route_localnet") == 0);
  auto missing = sysctls.writeInt("net/ipv4/conf/all/nope", 1);
  REQUIRE_FALSE(missing);
  CHECK(missing.error().errnum == ENOENT);
  CHECK_FALSE(fs::exists(root.path / "net/ipv4/conf/all/nope"));
}

TEST_CASE("a read-only value reports its errno", "[unit]") {
  if (::geteuid() == 0) {
    WARN("root writes read-only files; not checked");
    return;
  }
  TempRoot root;
  root.put("net/netfilter/nf_conntrack_max", "65536\n");
  ::chmod((root.path / "net/netfilter/nf_conntrack_max").c_str(), 0444);
  auto written = SysctlFiles(root.path).writeInt("net/netfilter/nf_conntrack_max", 131072);
  REQUIRE_FALSE(written);
  CHECK(written.error().errnum == EACCES);
  CHECK(root.get("net/netfilter/nf_conntrack_max") == "65536\n");
}

TEST_CASE("IPv6 counts as there only when the kernel has it and it is not disabled", "[unit]") {
  TempRoot root;
  SysctlFiles sysctls(root.path);
  CHECK_FALSE(kproxy::backends::kernelHasIPv6(sysctls));  // no net/ipv6: not compiled in
  root.put("net/ipv6/conf/all/disable_ipv6", "1\n");
  CHECK_FALSE(kproxy::backends::kernelHasIPv6(sysctls));
  root.put("net/ipv6/conf/all/disable_ipv6", "0\n");
  CHECK(kproxy::backends::kernelHasIPv6(sysctls));
}
