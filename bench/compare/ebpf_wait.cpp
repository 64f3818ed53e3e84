// kproxy-bench-ebpfwait: bench/compare's first-sync counter and change detector in ebpf mode,
// over the maps kproxy pins (PIN_DIR/kproxy_services and PIN_DIR/kproxy_slots). BPF maps have
// no change events, so each awaited ClusterIP's element and its cluster slots are looked up,
// every millisecond by default: a handful of bpf() calls, microseconds each.
//
//   kproxy-bench-ebpfwait PIN_DIR count
//     prints "services=N", the elements of the services map (the harness polls it during a
//     first sync, so it walks the smaller map only)
//   kproxy-bench-ebpfwait PIN_DIR [--interval-ms N] [--timeout-s N] wait VIP:PORT=ADDR...
//     TCP ClusterIPs, IPv4. Prints "polling" once it has looked once, "seen ADDR" as each ADDR
//     appears among its VIP's cluster slots, then "done"; each line is flushed at once, as the
//     harness times its arrival.
//
// Exit status 0 when all were seen (or counted), 1 on timeout, 2 on a bad command line or a map
// that cannot be opened.

#include <arpa/inet.h>
#include <linux/types.h>
#include <netinet/in.h>

#include <bpf/bpf.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "map_layout.h"

namespace {

[[noreturn]] void usage(std::string_view what, const char* why) {
  std::fprintf(stderr,
               "kproxy-bench-ebpfwait: %.*s%s%s\n"
               "usage: kproxy-bench-ebpfwait PIN_DIR count\n"
               "       kproxy-bench-ebpfwait PIN_DIR [--interval-ms N] [--timeout-s N] wait VIP:PORT=ADDR...\n",
               static_cast<int>(what.size()), what.data(), what.empty() ? "" : ": ", why);
  std::exit(2);
}

int openMap(const std::string& path) {
  const int fd = bpf_obj_get(path.c_str());
  if (fd < 0) usage(path, std::strerror(errno));
  return fd;
}

std::size_t countElements(int fd) {
  kproxy_lb_service_key key{}, next{};
  std::size_t n = 0;
  for (kproxy_lb_service_key* at = nullptr; bpf_map_get_next_key(fd, at, &next) == 0; at = &key) {
    key = next;
    ++n;
  }
  return n;
}

struct Awaited {
  kproxy_lb_service_key service{};
  in_addr address{};
  std::string text;
  bool seen = false;
};

Awaited parse(std::string_view arg) {
  const auto eq = arg.find('=');
  const auto colon = arg.rfind(':', eq);
  if (eq == std::string_view::npos || colon == std::string_view::npos) usage(arg, "not VIP:PORT=ADDR");
  const std::string vip(arg.substr(0, colon)), port(arg.substr(colon + 1, eq - colon - 1));
  Awaited a;
  a.text = std::string(arg.substr(eq + 1));
  in_addr v{};
  if (::inet_pton(AF_INET, vip.c_str(), &v) != 1 || ::inet_pton(AF_INET, a.text.c_str(), &a.address) != 1)
    usage(arg, "not IPv4 addresses");
  std::memcpy(a.service.address, &v, sizeof v);
  a.service.port = htons(static_cast<std::uint16_t>(std::atoi(port.c_str())));
  a.service.protocol = IPPROTO_TCP;
  a.service.family = KPROXY_FAMILY_IPV4;
  return a;
}

/// Whether `a`'s address is among its service's cluster slots now.
bool present(int services, int slots, const Awaited& a) {
  kproxy_lb_service_value value{};
  if (bpf_map_lookup_elem(services, &a.service, &value) != 0) return false;
  for (__u32 slot = 0; slot < value.count; ++slot) {
    kproxy_lb_slot_key key{value.id, slot};
    kproxy_lb_endpoint endpoint{};
    if (bpf_map_lookup_elem(slots, &key, &endpoint) == 0 && endpoint.family == KPROXY_FAMILY_IPV4 &&
        std::memcmp(endpoint.address, &a.address, sizeof a.address) == 0)
      return true;
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) usage("", "too few arguments");
  const std::string dir = argv[1];
  int interval = 1, timeout = 120, i = 2;
  for (; i + 1 < argc && std::string_view(argv[i]).starts_with("--"); i += 2) {
    const std::string_view flag = argv[i];
    if (flag == "--interval-ms")
      interval = std::atoi(argv[i + 1]);
    else if (flag == "--timeout-s")
      timeout = std::atoi(argv[i + 1]);
    else
      usage(flag, "unknown flag");
  }
  if (i >= argc) usage("", "no command");
  const std::string_view command = argv[i++];
  const int services = openMap(dir + "/kproxy_services");
  const int slots = openMap(dir + "/kproxy_slots");
  if (command == "count") {
    std::printf("services=%zu\n", countElements(services));
    return 0;
  }
  if (command != "wait" || i >= argc) usage(command, "want count, or wait with VIP:PORT=ADDR...");
  std::vector<Awaited> awaited;
  for (; i < argc; ++i) awaited.push_back(parse(argv[i]));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout);
  std::size_t left = awaited.size();
  for (bool first = true;; first = false) {
    for (auto& a : awaited) {
      if (a.seen || !present(services, slots, a)) continue;
      a.seen = true;
      --left;
      std::printf("seen %s\n", a.text.c_str());
      std::fflush(stdout);
    }
    if (first) {
      std::printf("polling\n");
      std::fflush(stdout);
    }
    if (left == 0) {
      std::printf("done\n");
      return 0;
    }
    if (std::chrono::steady_clock::now() > deadline) return 1;
    std::this_thread::sleep_for(std::chrono::milliseconds(interval));
  }
}
