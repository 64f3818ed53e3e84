// PrintingKernelMaps: --dry-run's kernel (kernel.h).
#include <fmt/format.h>

#include "kproxy/ebpf/kernel.h"

namespace kproxy::ebpf {

core::Result<void> PrintingKernelMaps::apply(const std::vector<MapOp>& ops) {
  for (const auto& op : ops) fmt::print(out_, "{}\n", op.toText());
  std::fflush(out_);
  return inner_->apply(ops);
}

core::Result<void> PrintingKernelMaps::removeAll() {
  fmt::print(out_, "detach programs and remove pins\n");
  std::fflush(out_);
  return inner_->removeAll();
}

}  // namespace kproxy::ebpf
