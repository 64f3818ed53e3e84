// Measures the cost of one endpoint change in the core: upsert one EndpointSlice and publish
// the next snapshot, in clusters of increasing size. Each size runs in its own child process
// so that its resident memory is measured alone.
//
//   kproxy-bench-snapshot [iterations] [sizes...]     (defaults: 2000; 1000 10000 50000)

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <new>
#include <random>
#include <string>
#include <vector>

#include "kproxy/core/tracker.h"

namespace net = kproxy::net;

using namespace kproxy::core;

// Heap allocations made while a change is applied: a count that does not depend on the
// machine's speed or caches, so it shows directly that the work per change is the same at
// every cluster size.
namespace {
bool gCounting = false;
std::size_t gAllocs = 0;
std::size_t gAllocBytes = 0;
}  // namespace

void* operator new(std::size_t size) {
  if (gCounting) {
    ++gAllocs;
    gAllocBytes += size;
  }
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
// g++ 12 cannot see that these pair with the replaced operator new above.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
#pragma GCC diagnostic pop

namespace {

long rssKiB() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::strtol(line.c_str() + 6, nullptr, 10);
  }
  return -1;
}

// snprintf rather than string concatenation: g++ 12 at -O3 reports a false -Wrestrict on
// chains of std::string operator+.
std::string ipv4(std::uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%u.%u.%u.%u", (v >> 24) & 255, (v >> 16) & 255, (v >> 8) & 255,
                v & 255);
  return buf;
}

std::string serviceName(int i) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "svc-%d", i);
  return buf;
}

Service makeService(int i) {
  Service s;
  s.ns = "bench";
  s.name = serviceName(i);
  s.resourceVersion = std::string("1");  // (assigning a literal trips g++ 12 -Wrestrict at -O3)
  s.clusterIPs = {ipv4(0x0A600000u + static_cast<std::uint32_t>(i))};  // 10.96.0.0/12
  s.ipFamilies = {net::Family::kIPv4};
  ServicePortSpec p;
  p.name = "http";
  p.port = 80;
  p.targetPort.number = 8080;
  s.ports = {p};
  return s;
}

EndpointSlice makeSlice(int i, std::uint32_t generation) {
  EndpointSlice s;
  s.ns = "bench";
  s.serviceName = serviceName(i);
  s.name = s.serviceName;
  s.name += "-abcde";
  s.labels[kLabelServiceName] = s.serviceName;
  s.resourceVersion = std::to_string(generation);
  EndpointPort p;
  p.name = "http";
  p.port = 8080;
  p.protocol = Protocol::kTCP;
  s.ports = {p};
  // Two endpoints; the second one's address moves with `generation` so every update is real.
  const std::uint32_t base = 0x0AF40000u + static_cast<std::uint32_t>(i) * 4;  // 10.244.0.0/14
  for (std::uint32_t k = 0; k < 2; ++k) {
    SliceEndpoint e;
    e.addresses = {ipv4(base + k + (k == 1 ? (generation % 2) * 2 : 0))};
    e.conditions.ready = true;
    e.nodeName = k == 0 ? "node-a" : "node-b";
    e.zone = "zone-1";
    s.endpoints.push_back(e);
  }
  return s;
}

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  const auto index = static_cast<std::size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(index, v.size() - 1)];
}

// Runs one size; prints one table row.
void runSize(int services, int iterations) {
  const long rssBefore = rssKiB();
  TrackerConfig config;
  config.nodeName = "node-a";
  ChangeTracker tracker(config);

  const auto buildStart = std::chrono::steady_clock::now();
  for (int i = 0; i < services; ++i) {
    tracker.upsertService(makeService(i));
    tracker.upsertEndpointSlice(makeSlice(i, 0));
  }
  auto initial = tracker.publish();
  const double buildMs =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - buildStart).count();
  if (initial.snapshot->size() != static_cast<std::size_t>(services)) {
    std::fprintf(stderr, "unexpected snapshot size %zu\n", initial.snapshot->size());
    std::exit(1);
  }
  initial = {};
  const long rssBuilt = rssKiB();

  std::mt19937 rng(42);
  std::uniform_int_distribution<int> pick(0, services - 1);
  std::vector<std::uint32_t> generation(static_cast<std::size_t>(services), 0);
  std::vector<double> micros;
  micros.reserve(static_cast<std::size_t>(iterations));
  std::size_t changedTotal = 0;
  for (int n = 0; n < iterations; ++n) {
    const int i = pick(rng);
    EndpointSlice slice = makeSlice(i, ++generation[static_cast<std::size_t>(i)]);  // built outside the timing
    const auto start = std::chrono::steady_clock::now();
    gCounting = true;
    tracker.upsertEndpointSlice(std::move(slice));
    PublishResult r = tracker.publish();
    gCounting = false;
    const auto end = std::chrono::steady_clock::now();
    changedTotal += r.changed.size();
    micros.push_back(std::chrono::duration<double, std::micro>(end - start).count());
  }
  if (changedTotal != static_cast<std::size_t>(iterations)) {
    std::fprintf(stderr, "expected one changed key per iteration, got %zu\n", changedTotal);
    std::exit(1);
  }
  std::printf("| %8d | %10d | %11.1f | %10.2f | %10.2f | %10.2f | %13.1f | %13.1f | %13.0f |\n",
              services, iterations, buildMs, percentile(micros, 0.5), percentile(micros, 0.99),
              *std::max_element(micros.begin(), micros.end()),
              static_cast<double>(rssBuilt - rssBefore) / 1024.0,
              static_cast<double>(gAllocs) / iterations,
              static_cast<double>(gAllocBytes) / iterations);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  int iterations = 2000;
  std::vector<int> sizes = {1000, 10000, 50000};
  if (argc > 1) iterations = std::atoi(argv[1]);
  if (argc > 2) {
    sizes.clear();
    for (int i = 2; i < argc; ++i) sizes.push_back(std::atoi(argv[i]));
  }
  std::printf("One endpoint change = upsert one EndpointSlice + publish() (1 port, 2 endpoints per service)\n\n");
  std::printf("| services | iterations | build (ms) | median (us) | p99 (us)   | max (us)   | RSS (MiB)     | allocs/change | bytes/change  |\n");
  std::printf("|---------:|-----------:|------------:|-----------:|-----------:|-----------:|--------------:|--------------:|--------------:|\n");
  std::fflush(stdout);
  for (int size : sizes) {
    const pid_t pid = fork();
    if (pid < 0) {
      std::perror("fork");
      return 1;
    }
    if (pid == 0) {
      runSize(size, iterations);
      std::_Exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      std::fprintf(stderr, "size %d failed\n", size);
      return 1;
    }
  }
  std::printf("\nRSS is the growth of the child process's resident set while building the tracker\n"
              "(services, slices and the snapshot).\n");
  return 0;
}
