// kproxy-bench-ebpf: ebpf mode's control plane at scale, inside the plugin: the first (full)
// sync of S services × E endpoints into the real BPF maps and the nftables part, one endpoint
// removed (the median and the worst of R changes, each timed from the sync call to its return,
// with the element writes it made), and a restart (a new backend over the same pins: what it
// reads back and writes). Peak RSS is the measuring process's (the generated snapshot hands
// out one port at a time, so the mirror and the maps' buffers are what it holds).
//
// Each size runs in a forked child in a network namespace and a mount namespace of its own: a
// bpffs mounted in a temporary directory holds the pins, and the programs attach to a cgroup
// the benchmark makes (never the root) and removes. Needs root.
//
//   kproxy-bench-ebpf [--services 1000,10000,100000] [--endpoints 10] [--change-repeat 101]

#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "../common/sync_bench.h"
#include "../nftables/bench_args.h"
#include "kproxy/ebpf/backend.h"

using namespace kproxy;

namespace {

using bench::Clock;
using bench::GeneratedSnapshot;
using bench::msSince;

/// Where one size runs: a cgroup of the benchmark's under the cgroup v2 root, and a scratch
/// directory for the bpffs mount. Both are removed by the parent after the child exits.
struct Place {
  std::string cgroup;
  std::string scratch;
};

/// Runs `body(place)` in a forked child in fresh network and mount namespaces with a private
/// bpffs; returns whether it succeeded.
template <typename Fn>
bool inChild(const Place& place, Fn&& body) {
  return bench::inChild(CLONE_NEWNET | CLONE_NEWNS, [&]() -> int {
    // The bpffs mount stays in this namespace and goes away with it.
    if (mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
        mount("bpf", place.scratch.c_str(), "bpf", 0, nullptr) != 0) {
      std::perror("mount bpffs");
      return 2;
    }
    return body(place);
  });
}

sdk::Expected<std::unique_ptr<sdk::BackendPlugin>> openBackend(const Place& place) {
  return ebpf::makeEbpfBackend(sdk::Host(nullptr), {{"ebpf-cgroup-path", place.cgroup},
                                                    {"ebpf-pin-path", place.scratch + "/kproxy"}});
}

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<std::size_t>(p * static_cast<double>(v.size())))];
}

int measure(const Place& place, int services, int endpoints, int repeat) {
  GeneratedSnapshot snap(services, endpoints);
  const long baseRss = bench::currentRssMiB();
  auto made = openBackend(place);
  if (!made) {
    std::printf("cannot open the plugin: %s\n", made.error().message.c_str());
    return 1;
  }
  auto* backend = dynamic_cast<ebpf::EbpfBackend*>(made->get());
  auto t = Clock::now();
  auto full = backend->syncFrom(snap, {}, true);
  const double fullMs = msSince(t);
  if (!full) {
    std::printf("full sync failed: %s\n", full.error().message.c_str());
    return 1;
  }
  const std::size_t fullWrites = backend->lastWrites();
  // One endpoint removed, then restored, `repeat` times; the figures are the removals'.
  auto& p = snap.port(services / 2);
  const auto all = p.clusterEndpoints;
  std::vector<double> removalsUs;
  std::size_t changeWrites = 0;
  sdk::Expected<sdk::SyncOutcome> change = sdk::SyncOutcome{};
  for (int r = 0; r < repeat; ++r) {
    nftables::testing::setEndpoints(p, {all.begin(), all.end() - 1});
    t = Clock::now();
    change = backend->syncFrom(snap, {{net::Family::kIPv4, p.key}}, false);
    removalsUs.push_back(msSince(t) * 1000);
    changeWrites = backend->lastWrites();
    if (!change) {
      std::printf("change sync failed: %s\n", change.error().message.c_str());
      return 1;
    }
    nftables::testing::setEndpoints(p, all);
    if (auto back = backend->syncFrom(snap, {{net::Family::kIPv4, p.key}}, false); !back) {
      std::printf("restore sync failed: %s\n", back.error().message.c_str());
      return 1;
    }
  }
  const long peakRss = bench::peakRssMiB();
  // A restart: the old backend goes (its pins stay), a new one reads the maps back.
  made->reset();
  auto again = openBackend(place);
  if (!again) {
    std::printf("cannot reopen the plugin: %s\n", again.error().message.c_str());
    return 1;
  }
  auto* restarted = dynamic_cast<ebpf::EbpfBackend*>(again->get());
  t = Clock::now();
  auto resync = restarted->syncFrom(snap, {}, true);
  const double resyncMs = msSince(t);
  std::fprintf(stderr, "  [%d x %d] full: %s\n  [%d x %d] change: %s\n  [%d x %d] restart: %s\n", services,
               endpoints, full->summary.c_str(), services, endpoints, change->summary.c_str(), services,
               endpoints, resync ? resync->summary.c_str() : resync.error().message.c_str());
  std::printf("%10.1f %9zu | %9.1f %9.1f %6zu | %10.1f %7zu | %8ld %8ld\n", fullMs, fullWrites,
              percentile(removalsUs, 0.5), percentile(removalsUs, 0.99), changeWrites, resync ? resyncMs : -1.0,
              resync ? restarted->lastWrites() : 0, peakRss, baseRss);
  (void)restarted->cleanup();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> sizes{1000, 10000, 100000};
  std::vector<int> endpointCounts{10};
  int repeat = 101;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--services" && i + 1 < argc) sizes = bench::parseList(argv[++i]);
    else if (a == "--endpoints" && i + 1 < argc) endpointCounts = bench::parseList(argv[++i]);
    else if (a == "--change-repeat" && i + 1 < argc) repeat = std::max(1, std::atoi(argv[++i]));
    else {
      std::fprintf(stderr, "usage: %s [--services 1000,10000,100000] [--endpoints 10] [--change-repeat 101]\n",
                   argv[0]);
      return 2;
    }
  }
  if (geteuid() != 0) {
    std::fprintf(stderr, "kproxy-bench-ebpf needs root (namespaces, bpffs, BPF programs)\n");
    return 1;
  }
  auto root = ebpf::cgroupV2Root();
  if (!root) {
    std::fprintf(stderr, "kproxy-bench-ebpf: no cgroup v2 hierarchy is mounted\n");
    return 1;
  }
  std::printf("%-8s %-4s | %10s %9s | %9s %9s %6s | %10s %7s | %8s %8s\n", "services", "eps", "full_ms", "writes",
              "chg_p50us", "chg_p99us", "writes", "restart_ms", "writes", "peak_MiB", "base_MiB");
  int failures = 0;
  for (int n : sizes) {
    for (int eps : endpointCounts) {
      Place place{fmt::format("{}/kproxy-bench-ebpf-{}-{}-{}", *root, getpid(), n, eps),
                  fmt::format("/tmp/kproxy-bench-ebpf-{}-{}-{}", getpid(), n, eps)};
      std::error_code ec;
      std::filesystem::create_directories(place.scratch, ec);
      if (::mkdir(place.cgroup.c_str(), 0755) != 0 && errno != EEXIST) {
        std::fprintf(stderr, "mkdir %s: %s\n", place.cgroup.c_str(), std::strerror(errno));
        return 1;
      }
      std::printf("%-8d %-4d | ", n, eps);
      if (!inChild(place, [&](const Place& where) { return measure(where, n, eps, repeat); })) {
        std::printf("\n");
        ++failures;
      }
      ::rmdir(place.cgroup.c_str());
      std::filesystem::remove_all(place.scratch, ec);
    }
  }
  return failures == 0 ? 0 : 1;
}
