#pragma once
/// The userspace backend's kernel interfaces: the nftables backend's KernelNftables for the
/// kproxy-userspace table, and ProxyListeners (proxy.h) for the proxy's sockets. --dry-run
/// gives the backend their printing decorators (kernel_printing.cpp), which print what each
/// call changes and hand the call on: the table to an empty FakeKernelNftables, the listeners
/// to a ProxyServer that binds but never listens (so the printed ports are real ones).
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

/// The table's changes in nft syntax (for table `table`, ip and ip6), in the order a kernel
/// transaction sends them (by batch phase, as nftables' dry-run prints), then applied to
/// `inner`, which answers every read: `add table ip kproxy-userspace`, `add element ip
/// kproxy-userspace services { … }`, `delete table ip kproxy-userspace`.
class PrintingNftables final : public nftables::KernelNftables {
 public:
  PrintingNftables(std::unique_ptr<nftables::KernelNftables> inner, std::FILE* out, std::string table);
  core::Result<void> apply(const std::vector<nftables::Op>& ops) override;
  core::Result<nftables::Mirror> readBack(const std::vector<nftables::SetSpec>& ip4Sets,
                                          const std::vector<nftables::SetSpec>& ip6Sets) override {
    return inner_->readBack(ip4Sets, ip6Sets);
  }
  core::Result<void> deleteTables() override;
  core::Result<std::vector<std::pair<std::string, std::string>>> listMap(net::Family family,
                                                                         const std::string& map) override {
    return inner_->listMap(family, map);
  }
  core::Result<std::optional<std::uint32_t>> generation() override { return inner_->generation(); }
  std::optional<bool> foreignTouched(std::optional<std::uint32_t> until) override {
    return inner_->foreignTouched(until);
  }

 private:
  std::unique_ptr<nftables::KernelNftables> inner_;
  std::FILE* out_;
  std::string table_;
};

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
