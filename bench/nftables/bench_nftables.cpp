// kproxy-bench-nftables: the nftables backend's full and one-endpoint-change syncs at scale,
// against two baselines — `nft -f` of kproxy's own ruleset (the dry-run text) and `nft -f` of
// upstream kube-proxy's ruleset shape (per-service `numgen … vmap` sets) for the same services.
// Every measurement runs in a forked child inside its own network namespace (needs root).
//
//   kproxy-bench-nftables [--services 1000,10000] [--endpoints 2,10] [--upstream-max 10000]
//                         [--no-baselines] [--change-repeat 11]

#include <sched.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "../common/sync_bench.h"
#include "bench_args.h"
#include "kproxy/nftables/backend.h"
#include "kproxy/nftables/renderer.h"

using namespace kproxy;
using namespace kproxy::nftables;

namespace {

using bench::Clock;
using bench::currentRssMiB;
using bench::GeneratedSnapshot;
using bench::msSince;
using bench::peakRssMiB;

/// Runs `body` in a forked child in a fresh network namespace; returns whether it succeeded.
template <typename Fn>
bool inChildNetns(Fn&& body) {
  return bench::inChild(CLONE_NEWNET, std::forward<Fn>(body));
}

double timeNftFile(const std::string& path) {
  auto t = Clock::now();
  int rc = std::system(("nft -f " + path).c_str());
  double ms = msSince(t);
  return rc == 0 ? ms : -1;
}

/// Upstream kube-proxy's shape for the same services: each service chain holds an anonymous
/// `numgen random mod N vmap { … }` set; one chain per endpoint; the shared service-ips map.
void writeUpstreamShape(const std::vector<sdk::ServicePort>& ports, const std::string& path) {
  std::ofstream f(path);
  f << "add table ip kube-proxy\n"
       "add chain ip kube-proxy nat-prerouting { type nat hook prerouting priority -100 ; }\n"
       "add chain ip kube-proxy services\n"
       "add chain ip kube-proxy mark-for-masquerade\n"
       "add rule ip kube-proxy mark-for-masquerade meta mark set meta mark | 0x4000\n"
       "add map ip kube-proxy service-ips { type ipv4_addr . inet_proto . inet_service : verdict ; }\n"
       "add rule ip kube-proxy nat-prerouting jump services\n"
       "add rule ip kube-proxy services ip daddr . meta l4proto . th dport vmap @service-ips\n";
  for (const auto& p : ports) {
    std::string svc = serviceChainName(p);
    f << "add chain ip kube-proxy " << svc << "\n";
    std::string vmap;
    for (std::size_t i = 0; i < p.clusterEndpoints.size(); ++i) {
      const auto& ep = p.clusterEndpoints[i];
      std::string epChain = endpointChainName(p, ep);
      f << "add chain ip kube-proxy " << epChain << "\n"
        << "add rule ip kube-proxy " << epChain << " ip saddr " << ep.ip << " jump mark-for-masquerade\n"
        << "add rule ip kube-proxy " << epChain << " meta l4proto tcp dnat to " << ep.ip << ":" << ep.port
        << "\n";
      vmap += fmt::format("{}{} : goto {}", i == 0 ? "" : ", ", i, epChain);
    }
    f << "add rule ip kube-proxy " << svc << " numgen random mod " << p.clusterEndpoints.size()
      << " vmap { " << vmap << " }\n";
    f << "add element ip kube-proxy service-ips { " << p.clusterIP << " . tcp . " << p.port
      << " : goto " << svc << " }\n";
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> sizes{1000, 10000};
  std::vector<int> endpoints{2, 10};
  int upstreamMax = 10000;
  bool baselines = true;
  int changeRepeat = 11;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--services" && i + 1 < argc) sizes = kproxy::bench::parseList(argv[++i]);
    else if (a == "--endpoints" && i + 1 < argc) endpoints = kproxy::bench::parseList(argv[++i]);
    else if (a == "--upstream-max" && i + 1 < argc) upstreamMax = std::atoi(argv[++i]);
    else if (a == "--no-baselines") baselines = false;
    else if (a == "--change-repeat" && i + 1 < argc) changeRepeat = std::max(1, std::atoi(argv[++i]));
    else {
      std::fprintf(stderr,
                   "usage: %s [--services 1000,10000,30000] [--endpoints 2,10] "
                   "[--upstream-max N] [--no-baselines] [--change-repeat N]\n",
                   argv[0]);
      return 2;
    }
  }
  if (geteuid() != 0) {
    std::fprintf(stderr, "kproxy-bench-nftables needs root (it creates network namespaces)\n");
    return 1;
  }
  std::printf("%-8s %-4s | %10s %8s %10s %8s %10s %8s %8s | %12s %12s\n", "services", "eps",
              "full_ms", "ops", "change_ms", "ops", "resync_ms", "rss_MiB", "base_MiB",
              "nft_own_ms", "nft_upstr_ms");
  for (int n : sizes) {
    for (int eps : endpoints) {
      std::printf("%-8d %-4d | ", n, eps);
      std::fflush(stdout);
      bool ok = inChildNetns([&]() -> int {
        GeneratedSnapshot snap(n, eps);
        const long baseRss = currentRssMiB();
        BackendSettings settings;
        auto backend = std::make_unique<NftablesBackend>(sdk::Host(nullptr), settings, makeNetlinkKernel());
        auto t = Clock::now();
        auto full = backend->syncFrom(snap, {}, true);
        double fullMs = msSince(t);
        if (!full) {
          std::printf("full sync failed: %s\n", full.error().message.c_str());
          return 1;
        }
        // One endpoint removed, then restored, `changeRepeat` times each; the figure is the
        // median of the removals (a single sync is at the mercy of the machine's noise).
        auto& p = snap.port(n / 2);
        const auto allEndpoints = p.clusterEndpoints;
        std::vector<double> removals, removalKernel;
        sdk::Expected<sdk::SyncOutcome> change = sdk::SyncOutcome{};
        for (int r = 0; r < changeRepeat; ++r) {
          testing::setEndpoints(p, {allEndpoints.begin(), allEndpoints.end() - 1});
          t = Clock::now();
          change = backend->syncFrom(snap, {{net::Family::kIPv4, p.key}}, false);
          removals.push_back(msSince(t));
          removalKernel.push_back(backend->lastApplyMs());
          if (!change) {
            std::printf("change sync failed: %s\n", change.error().message.c_str());
            return 1;
          }
          if (r + 1 == changeRepeat) break;  // leave it removed, as the restart below expects
          testing::setEndpoints(p, allEndpoints);
          auto back = backend->syncFrom(snap, {{net::Family::kIPv4, p.key}}, false);
          if (!back) {
            std::printf("restore sync failed: %s\n", back.error().message.c_str());
            return 1;
          }
        }
        std::sort(removals.begin(), removals.end());
        double changeMs = removals[removals.size() / 2];
        std::sort(removalKernel.begin(), removalKernel.end());
        double changeKernelMs = removalKernel[removalKernel.size() / 2];
        // A restart: a new backend reads the table back and finds nothing to do. The old one
        // goes first, as in a real restart, so the peak is one backend's.
        backend.reset();
        NftablesBackend restarted(sdk::Host(nullptr), settings, makeNetlinkKernel());
        t = Clock::now();
        auto resync = restarted.syncFrom(snap, {}, true);
        double resyncMs = msSince(t);
        std::fprintf(stderr, "  [%d x %d] full: %s\n  [%d x %d] change: %s (median of %d: %.2f ms, kernel %.2f ms)\n",
                     n, eps, full->summary.c_str(), n, eps, change->summary.c_str(), changeRepeat,
                     changeMs, changeKernelMs);
        std::printf("%10.1f %8lu %10.2f %8lu %10.1f %8ld %8ld | ", fullMs,
                    static_cast<unsigned long>(full->operations), changeMs,
                    static_cast<unsigned long>(change->operations),
                    resync ? resyncMs : -1.0, peakRssMiB(), baseRss);
        return 0;
      });
      if (!ok) {
        std::printf("\n");
        continue;
      }
      if (!baselines) {
        std::printf("\n");
        continue;
      }
      std::string ownPath = fmt::format("/tmp/kproxy-bench-own-{}-{}.nft", n, eps);
      std::string upPath = fmt::format("/tmp/kproxy-bench-upstream-{}-{}.nft", n, eps);
      {
        auto ports = testing::manyServices(n, eps);
        VectorSnapshot snap(ports);
        BackendSettings settings;
        settings.dryRun = true;
        settings.dryRunOutput = std::fopen(ownPath.c_str(), "w");
        // As the factory does for --dry-run: the printer over tables in memory, no kernel.
        NftablesBackend dry(sdk::Host(nullptr), settings,
                            std::make_unique<PrintingNftables>(std::make_unique<FakeKernelNftables>(),
                                                               settings.dryRunOutput));
        (void)dry.syncFrom(snap, {}, true);
        std::fclose(settings.dryRunOutput);
        if (n <= upstreamMax) writeUpstreamShape(ports, upPath);
      }
      inChildNetns([&]() -> int {
        std::printf("%12.1f ", timeNftFile(ownPath));
        return 0;
      });
      inChildNetns([&]() -> int {
        if (n <= upstreamMax) std::printf("%12.1f", timeNftFile(upPath));
        else std::printf("%12s", "skipped");
        return 0;
      });
      std::printf("\n");
      std::remove(ownPath.c_str());
      std::remove(upPath.c_str());
    }
  }
  return 0;
}
