#pragma once
/// Connected UDP sockets the data path steered, seen as the conntrack flows they stand for, so
/// that the conntrack cleaner (backends/common/conntrack_cleaner.h) decides which are stale
/// with its own rules, after the same syncs: a socket that connected to service address S and
/// was steered to endpoint E stands for the flow whose original destination is S and whose
/// reply source is E. Where the netfilter modes delete that flow (E no longer serves the
/// service port) and the next datagram is NATed afresh, ebpf mode ends the socket: the
/// application's next receive fails with ECONNABORTED (a send, with EDESTADDRREQ: the socket
/// is no longer connected), and its next connect is steered to a serving endpoint.
///
/// Thread-safety: one thread at a time.

#include <optional>
#include <string>
#include <vector>

#include "kproxy/ebpf/kernel.h"
#include "kproxy/kernel/conntrack_table.h"

namespace kproxy::ebpf {

/// The flow a netfilter mode would hold for `socket`: original local → service, reply
/// endpoint → local.
kernel::ConntrackFlow flowOf(const SteeredSocket& socket);

class SteeredSocketTable final : public kernel::ConntrackTable {
 public:
  explicit SteeredSocketTable(KernelMaps& kernel) : kernel_(kernel) {}
  /// The flows of the steered UDP sockets of `family` (none for another protocol). The kernel
  /// is walked once, at the first call: one table serves one cleanup.
  core::Result<std::vector<kernel::ConntrackFlow>> list(net::Family family, core::Protocol protocol) override;
  /// Ends the sockets listed behind `flows`; returns how many the kernel ended.
  core::Result<std::size_t> remove(const std::vector<kernel::ConntrackFlow>& flows) override;
  /// The namespaces the listing or the ending could not walk (SteeredSocketListing::skipped).
  std::vector<std::string> skippedNamespaces() const;

 private:
  KernelMaps& kernel_;
  std::optional<SteeredSocketListing> listing_;
};

}  // namespace kproxy::ebpf
