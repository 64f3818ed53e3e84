// PrintingKernelMaps: --dry-run's kernel (kernel.h); SteeredSocket's text.
#include <fmt/format.h>

#include "kproxy/ebpf/kernel.h"

namespace kproxy::ebpf {

std::string SteeredSocket::toText() const {
  return fmt::format("cookie={} {} -> {} ({})", cookie, local.toText(), service.toText(), endpoint.toText());
}

core::Result<void> PrintingKernelMaps::apply(const std::vector<MapOp>& ops) {
  for (const auto& op : ops) fmt::print(out_, "{}\n", op.toText());
  std::fflush(out_);
  return inner_->apply(ops);
}

core::Result<std::size_t> PrintingKernelMaps::endSockets(SteeredSocketListing& listing,
                                                         const std::vector<SteeredSocket>& sockets) {
  for (const auto& s : sockets) fmt::print(out_, "end socket {}\n", s.toText());
  std::fflush(out_);
  return inner_->endSockets(listing, sockets);
}

core::Result<void> PrintingKernelMaps::removeAll() {
  fmt::print(out_, "detach programs and remove pins\n");
  std::fflush(out_);
  return inner_->removeAll();
}

}  // namespace kproxy::ebpf
