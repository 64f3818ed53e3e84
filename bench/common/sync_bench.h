#pragma once
// What the sync benchmarks share (bench/nftables, bench/ebpf): the clock, the process's memory
// and the generated snapshot of N services of E endpoints each.

#include <sched.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <string>

#include "../../tests/unit/nftables/service_ports.h"
#include "kproxy/plan/snapshot_source.h"

namespace kproxy::bench {

using Clock = std::chrono::steady_clock;
inline double msSince(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

/// Peak resident set (ru_maxrss) of `who` (RUSAGE_SELF, RUSAGE_CHILDREN), MiB.
inline long peakRssMiB(int who = RUSAGE_SELF) {
  rusage u{};
  getrusage(who, &u);
  return u.ru_maxrss / 1024;
}

/// Resident set now (VmRSS), MiB: taken before the backend starts (the process, its libraries
/// and the snapshot source), so that the backend's own share of the peak is peak - this.
inline long currentRssMiB() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::atol(line.c_str() + 6) / 1024;
  return -1;
}

/// Runs `body()` in a forked child that first unshares `namespaces` (CLONE_NEWNET, CLONE_NEWNS,
/// or 0 for none); a grandchild forked by `body` stays in them. Returns whether it exited 0.
template <typename Fn>
bool inChild(int namespaces, Fn&& body) {
  std::fflush(stdout);
  std::fflush(stderr);
  pid_t pid = fork();
  if (pid < 0) return false;
  if (pid == 0) {
    if (namespaces != 0 && unshare(namespaces) != 0) {
      std::perror("unshare");
      _exit(2);
    }
    int rc = body();
    std::fflush(stdout);
    std::fflush(stderr);
    _exit(rc);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

/// The benchmark's services, generated when the backend asks for them: the backend sees one
/// service port at a time, as it does through the plugin ABI (the host converts each port
/// when it is visited), so the process's resident set is the backend's own. Changed ports are
/// kept as overrides. With `affinity`, every tenth service has ClientIP session affinity.
class GeneratedSnapshot final : public plan::SnapshotSource {
 public:
  GeneratedSnapshot(int services, int endpoints, bool affinity = true)
      : services_(services), endpoints_(endpoints), affinity_(affinity) {}
  void forEach(const std::function<void(const sdk::ServicePort&)>& fn) const override {
    for (int i = 0; i < services_; ++i) {
      if (auto it = overrides_.find(i); it != overrides_.end()) {
        fn(it->second);
        continue;
      }
      fn(nftables::testing::manyServicesPort(i, endpoints_, affinity_));
    }
  }
  std::optional<sdk::ServicePort> find(net::Family family, const std::string& key) const override {
    // Keys are "ns/svc-I:p".
    const auto at = key.find("/svc-");
    if (family != net::Family::kIPv4 || at == std::string::npos) return std::nullopt;
    const int i = std::atoi(key.c_str() + at + 5);
    if (i < 0 || i >= services_) return std::nullopt;
    if (auto it = overrides_.find(i); it != overrides_.end()) return it->second;
    auto p = nftables::testing::manyServicesPort(i, endpoints_, affinity_);
    if (p.key != key) return std::nullopt;
    return p;
  }
  sdk::NodeInfo node() const override { return {}; }
  /// Port `i`, to change in place.
  sdk::ServicePort& port(int i) {
    auto it = overrides_.find(i);
    if (it == overrides_.end()) it = overrides_.emplace(i, nftables::testing::manyServicesPort(i, endpoints_, affinity_)).first;
    return it->second;
  }

 private:
  int services_;
  int endpoints_;
  bool affinity_;
  std::map<int, sdk::ServicePort> overrides_;
};

}  // namespace kproxy::bench
