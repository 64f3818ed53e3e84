// FakeKernelMaps: the in-memory kernel of the unit tests (kernel.h).
#include <algorithm>

#include <fmt/format.h>

#include "kproxy/ebpf/kernel.h"

namespace kproxy::ebpf {

core::Result<MapContents> FakeKernelMaps::readBack() {
  ++readBacks;
  return maps;
}

core::Result<void> FakeKernelMaps::apply(const std::vector<MapOp>& ops) {
  ++applies;
  auto fail = failAt_;
  failAt_.reset();
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const MapOp& op = ops[i];
    if (fail && *fail == i)
      return core::makeError(core::ErrorCategory::kKernel, "ebpf: kernel refused \"" + op.toText() + "\"", failErrno_);
    bool found = true;
    switch (op.kind) {
      case MapOpKind::kUpdateSlot: maps.slots[op.slot] = op.endpoint; break;
      case MapOpKind::kUpdateService: maps.services[op.service] = op.value; break;
      case MapOpKind::kDeleteService: found = maps.services.erase(op.service) == 1; break;
      case MapOpKind::kDeleteSlot: found = maps.slots.erase(op.slot) == 1; break;
    }
    if (!found)
      return core::makeError(core::ErrorCategory::kKernel, "ebpf: kernel refused \"" + op.toText() + "\"", ENOENT);
    ++writes;
    if (watchHalfWritten) checkWhole(op);
  }
  return {};
}

void FakeKernelMaps::checkWhole(const MapOp& after) {
  for (const auto& [key, value] : maps.services) {
    auto check = [&](std::uint32_t base, std::uint16_t count) {
      for (std::uint32_t i = 0; i < count; ++i)
        if (!maps.slots.contains(SlotKey{value.id, base + i}))
          halfWritten.push_back(fmt::format("after \"{}\": {} counts {}, which is missing", after.toText(),
                                            key.toText(), SlotKey{value.id, base + i}.toText()));
    };
    check(0, value.count);
    check(kLocalSlotBase, value.localCount);
  }
}

core::Result<SteeredSocketListing> FakeKernelMaps::listSteeredSockets() {
  if (socketErrno != 0)
    return core::makeError(core::ErrorCategory::kKernel, "ebpf: listing steered sockets", socketErrno);
  return SteeredSocketListing{sockets, skippedNamespaces, nullptr};
}

core::Result<std::size_t> FakeKernelMaps::endSockets(SteeredSocketListing&, const std::vector<SteeredSocket>& ending) {
  if (socketErrno != 0)
    return core::makeError(core::ErrorCategory::kKernel, "ebpf: ending sockets", socketErrno);
  const std::size_t before = sockets.size();
  std::erase_if(sockets, [&](const SteeredSocket& s) {
    return std::find(ending.begin(), ending.end(), s) != ending.end();
  });
  return before - sockets.size();
}

core::Result<void> FakeKernelMaps::removeAll() {
  maps = {};
  return {};
}

}  // namespace kproxy::ebpf
