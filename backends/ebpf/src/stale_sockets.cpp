// SteeredSocketTable (stale_sockets.h): steered sockets as the conntrack cleaner's table.
#include "kproxy/ebpf/stale_sockets.h"

#include <set>
#include <string>

namespace kproxy::ebpf {

kernel::ConntrackFlow flowOf(const SteeredSocket& socket) {
  kernel::ConntrackFlow flow;
  flow.family = socket.local.family;
  flow.protocol = core::Protocol::kUDP;
  // The addresses in inet_ntop form, as the conntrack cleaner compares them.
  flow.original = {socket.local.ipText(), socket.service.ipText(), socket.local.port, socket.service.port};
  flow.reply = {socket.endpoint.ipText(), socket.local.ipText(), socket.endpoint.port, socket.local.port};
  return flow;
}

core::Result<std::vector<kernel::ConntrackFlow>> SteeredSocketTable::list(net::Family family,
                                                                          core::Protocol protocol) {
  std::vector<kernel::ConntrackFlow> out;
  if (protocol != core::Protocol::kUDP) return out;
  if (!listing_) {
    auto listed = kernel_.listSteeredSockets();
    if (!listed) return std::unexpected(listed.error());
    listing_ = std::move(*listed);
  }
  for (const auto& socket : listing_->sockets)
    if (socket.local.family == family) out.push_back(flowOf(socket));
  return out;
}

core::Result<std::size_t> SteeredSocketTable::remove(const std::vector<kernel::ConntrackFlow>& flows) {
  if (flows.empty() || !listing_) return 0;
  std::set<std::string> stale;
  for (const auto& flow : flows) stale.insert(flow.str());
  // Two sockets may stand for the same flow (SO_REUSEPORT): both go.
  std::vector<SteeredSocket> ending;
  for (const auto& socket : listing_->sockets)
    if (stale.contains(flowOf(socket).str())) ending.push_back(socket);
  if (ending.empty()) return 0;
  return kernel_.endSockets(*listing_, ending);
}

std::vector<std::string> SteeredSocketTable::skippedNamespaces() const {
  return listing_ ? listing_->skipped : std::vector<std::string>{};
}

}  // namespace kproxy::ebpf
