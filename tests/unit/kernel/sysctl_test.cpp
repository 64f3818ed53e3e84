#include "kproxy/kernel/sysctl.h"

#include <grp.h>
#include <pwd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <cerrno>
#include <filesystem>
#include <fstream>

#include "temp_directory.h"

using kproxy::kernel::SysctlFiles;
namespace fs = std::filesystem;

namespace {

/// A fresh directory standing in for /proc/sys, removed afterwards.
struct TempRoot : kproxy::testing::TempDirectory {
  TempRoot() : TempDirectory("kproxy-sysctl") {}
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
  // Root writes read-only files (CAP_DAC_OVERRIDE), so as root the write is tried by a child
  // that became nobody, and the files are nobody's: only the mode stands in its way.
  TempRoot root;
  root.put("net/netfilter/nf_conntrack_max", "65536\n");
  const fs::path file = root.path / "net/netfilter/nf_conntrack_max";
  const bool asRoot = ::geteuid() == 0;
  const passwd* nobody = asRoot ? ::getpwnam("nobody") : nullptr;
  const uid_t uid = nobody ? nobody->pw_uid : 65534;
  const gid_t gid = nobody ? nobody->pw_gid : 65534;
  if (asRoot)
    for (const auto& p : {root.path, root.path / "net", root.path / "net/netfilter", file})
      REQUIRE(::chown(p.c_str(), uid, gid) == 0);
  REQUIRE(::chmod(file.c_str(), 0444) == 0);

  // What the writer saw, from the child: whether it ran unprivileged, whether it could read
  // the value (so a refusal is the file's mode, not a directory in the way), and the errno.
  struct Seen {
    bool unprivileged = false;
    bool readable = false;
    bool written = false;
    int errnum = 0;
  } seen;
  int pipefd[2];
  REQUIRE(::pipe(pipefd) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    // The child never returns into Catch: it reports through the pipe and _exit()s.
    ::close(pipefd[0]);
    Seen s;
    if (!asRoot || (::setgroups(0, nullptr) == 0 && ::setgid(gid) == 0 && ::setuid(uid) == 0))
      s.unprivileged = ::geteuid() != 0;
    if (s.unprivileged) {
      SysctlFiles sysctls(root.path);
      auto value = sysctls.read("net/netfilter/nf_conntrack_max");
      s.readable = value && *value == "65536";
      auto written = sysctls.writeInt("net/netfilter/nf_conntrack_max", 131072);
      s.written = written.has_value();
      s.errnum = written ? 0 : written.error().errnum;
    }
    const bool sent = ::write(pipefd[1], &s, sizeof s) == static_cast<ssize_t>(sizeof s);
    ::_exit(sent ? 0 : 1);
  }
  ::close(pipefd[1]);
  const ssize_t got = ::read(pipefd[0], &seen, sizeof seen);
  ::close(pipefd[0]);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  REQUIRE(got == static_cast<ssize_t>(sizeof seen));
  REQUIRE(seen.unprivileged);
  REQUIRE(seen.readable);
  CHECK_FALSE(seen.written);
  CHECK(seen.errnum == EACCES);
  CHECK(root.get("net/netfilter/nf_conntrack_max") == "65536\n");
}

TEST_CASE("IPv6 counts as there only when the kernel has it and it is not disabled", "[unit]") {
  TempRoot root;
  SysctlFiles sysctls(root.path);
  CHECK_FALSE(kproxy::kernel::kernelHasIPv6(sysctls));  // no net/ipv6: not compiled in
  root.put("net/ipv6/conf/all/disable_ipv6", "1\n");
  CHECK_FALSE(kproxy::kernel::kernelHasIPv6(sysctls));
  root.put("net/ipv6/conf/all/disable_ipv6", "0\n");
  CHECK(kproxy::kernel::kernelHasIPv6(sysctls));
}
