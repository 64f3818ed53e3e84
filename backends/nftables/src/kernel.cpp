// What every KernelNftables shares: the phases a batch sends its ops in, and the default batch
// for kernels that take a whole transaction at once (apply).
#include "kproxy/nftables/kernel.h"

namespace kproxy::nftables {
namespace {

/// Keeps copies of the ops, by phase, and applies them at commit.
class CollectingBatch final : public KernelBatch {
 public:
  explicit CollectingBatch(KernelNftables& kernel) : kernel_(kernel) {}
  void append(std::span<const Op> ops) override {
    for (const auto& op : ops) phases_[static_cast<std::size_t>(batchPhase(op.kind))].push_back(op);
    size_ += ops.size();
  }
  std::size_t size() const override { return size_; }
  core::Result<void> commit() override {
    std::vector<Op> all;
    all.reserve(size_);
    for (auto& phase : phases_)
      for (auto& op : phase) all.push_back(std::move(op));
    return kernel_.apply(all);
  }

 private:
  KernelNftables& kernel_;
  std::vector<Op> phases_[kBatchPhases];
  std::size_t size_ = 0;
};

}  // namespace

BatchPhase batchPhase(OpKind kind) {
  switch (kind) {
    case OpKind::kDeleteElement: return BatchPhase::kDeleteElements;
    case OpKind::kAddElement: return BatchPhase::kAddElements;
    case OpKind::kDeleteChain: return BatchPhase::kDeleteChains;
    default: return BatchPhase::kStructure;
  }
}

std::unique_ptr<KernelBatch> KernelNftables::beginBatch() { return std::make_unique<CollectingBatch>(*this); }

}  // namespace kproxy::nftables
