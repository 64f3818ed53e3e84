// --dry-run's kernel interface (kernel.h): the table's changes in nft syntax, by batch phase as
// a kernel transaction sends them, printed, then handed to the inner adapter.
#include <utility>

#include "kproxy/nftables/kernel.h"

namespace kproxy::nftables {
namespace {

/// The ops as nft text, one a line, grouped by batch phase.
class PhasedText {
 public:
  void add(std::span<const Op> ops, std::string_view table) {
    for (const auto& op : ops) {
      auto& text = phases_[static_cast<std::size_t>(batchPhase(op.kind))];
      text += op.toText(table);
      text += '\n';
    }
  }
  void print(std::FILE* out) {
    for (auto& text : phases_) {
      std::fwrite(text.data(), 1, text.size(), out);
      text.clear();
    }
    std::fflush(out);
  }

 private:
  std::string phases_[kBatchPhases];
};

/// The inner kernel's transaction, with the text of what was appended to it, printed at commit.
class PrintingBatch final : public KernelBatch {
 public:
  PrintingBatch(std::unique_ptr<KernelBatch> inner, std::FILE* out, std::string_view table)
      : inner_(std::move(inner)), out_(out), table_(table) {}
  void append(std::span<const Op> ops) override {
    text_.add(ops, table_);
    inner_->append(ops);
  }
  std::size_t size() const override { return inner_->size(); }
  core::Result<void> commit() override {
    text_.print(out_);
    return inner_->commit();
  }

 private:
  std::unique_ptr<KernelBatch> inner_;
  std::FILE* out_;
  std::string_view table_;
  PhasedText text_;
};

}  // namespace

PrintingNftables::PrintingNftables(std::unique_ptr<KernelNftables> inner, std::FILE* out, std::string table)
    : inner_(std::move(inner)), out_(out), table_(std::move(table)) {}

core::Result<void> PrintingNftables::apply(const std::vector<Op>& ops) {
  PhasedText text;
  text.add(ops, table_);
  text.print(out_);
  return inner_->apply(ops);
}

std::unique_ptr<KernelBatch> PrintingNftables::beginBatch() {
  return std::make_unique<PrintingBatch>(inner_->beginBatch(), out_, table_);
}

core::Result<void> PrintingNftables::deleteTables() {
  std::fprintf(out_, "delete table ip %s\ndelete table ip6 %s\n", table_.c_str(), table_.c_str());
  std::fflush(out_);
  return inner_->deleteTables();
}

}  // namespace kproxy::nftables
