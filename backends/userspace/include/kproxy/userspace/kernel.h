#pragma once
/// The userspace backend's kernel interfaces: the nftables backend's KernelNftables for the
/// kproxy-userspace table, and ProxyListeners (proxy.h) for the proxy's sockets. --dry-run
/// gives the backend their printing decorators, which print what each call changes and hand
/// the call on: the table through nftables' PrintingNftables (kproxy/nftables/kernel.h) to an
/// empty FakeKernelNftables, the listeners through PrintingListeners (kernel_printing.cpp) to a
/// ProxyServer that binds but never listens (so the printed ports are real ones).
/// Thread-safety: as what they decorate; one sync at a time.

#include <cstdio>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "kproxy/nftables/kernel.h"
#include "kproxy/userspace/proxy.h"

namespace kproxy::userspace {

/// The listeners each update opens (with the port `inner` bound and the pool), the pools it
/// changes, and the listeners each retain closes, as comments beside the table's nft syntax:
/// `# userspace: listen ipv4 tcp/ns/web:http cluster :40123 -> 10.244.1.5:8080`,
/// `# userspace: pool of … -> …`, `# userspace: close …`. A failed update prints nothing.
class PrintingListeners final : public ProxyListeners {
 public:
  PrintingListeners(std::unique_ptr<ProxyListeners> inner, std::FILE* out);
  core::Result<std::map<std::string, std::uint16_t>> update(const std::vector<ListenerSpec>& specs) override;
  void retain(const std::set<std::string>& keep) override;

 private:
  struct Open {
    ListenerSpec spec;
    std::uint16_t port = 0;
  };
  std::unique_ptr<ProxyListeners> inner_;
  std::FILE* out_;
  std::map<std::string, Open> open_;  ///< by id: what the inner has open, as last told
};

}  // namespace kproxy::userspace
