// SteeredSocketTable (stale_sockets.h): steered sockets as the conntrack cleaner's table.
#include "kproxy/ebpf/stale_sockets.h"

#include <arpa/inet.h>

#include <set>
#include <string>

namespace kproxy::ebpf {
namespace {

/// The address alone, in inet_ntop form (the conntrack cleaner's).
std::string ipText(const SocketAddress& a) {
  char buf[INET6_ADDRSTRLEN] = {};
  const int af = a.family == net::Family::kIPv6 ? AF_INET6 : AF_INET;
  return ::inet_ntop(af, a.address.data(), buf, sizeof buf) == nullptr ? std::string() : std::string(buf);
}

}  // namespace

kernel::ConntrackFlow flowOf(const SteeredSocket& socket) {
  kernel::ConntrackFlow flow;
  flow.family = socket.local.family;
  flow.protocol = core::Protocol::kUDP;
  flow.original = {ipText(socket.local), ipText(socket.service), socket.local.port,
                   socket.service.port};
  flow.reply = {ipText(socket.endpoint), ipText(socket.local), socket.endpoint.port, socket.local.port};
  return flow;
}

core::Result<std::vector<kernel::ConntrackFlow>> SteeredSocketTable::list(net::Family family,
                                                                          core::Protocol protocol) {
  std::vector<kernel::ConntrackFlow> out;
  if (protocol != core::Protocol::kUDP) return out;
  if (!sockets_) {
    auto listed = kernel_.listSteeredSockets();
    if (!listed) return std::unexpected(listed.error());
    sockets_ = std::move(*listed);
  }
  for (const auto& socket : *sockets_)
    if (socket.local.family == family) out.push_back(flowOf(socket));
  return out;
}

core::Result<std::size_t> SteeredSocketTable::remove(const std::vector<kernel::ConntrackFlow>& flows) {
  if (flows.empty() || !sockets_) return 0;
  std::set<std::string> stale;
  for (const auto& flow : flows) stale.insert(flow.str());
  // Two sockets may stand for the same flow (SO_REUSEPORT): both go.
  std::vector<SteeredSocket> ending;
  for (const auto& socket : *sockets_)
    if (stale.contains(flowOf(socket).str())) ending.push_back(socket);
  if (ending.empty()) return 0;
  return kernel_.endSockets(ending);
}

}  // namespace kproxy::ebpf
