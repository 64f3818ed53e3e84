#pragma once
/// The iptables backend's view of the kernel: `iptables-save` / `iptables-restore` of one
/// variant (iptables-nft or iptables-legacy), IPv4 and IPv6, run without a shell through the
/// shared process runner. Behind an interface so the backend is testable without a kernel
/// (FakeIptables applies restore input to an in-memory ruleset).
/// Thread-safety: one caller at a time.

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "kproxy/core/error.h"
#include "kproxy/iptables/renderer.h"
#include "kproxy/kernel/process.h"

namespace kproxy::iptables {

enum class Variant : std::uint8_t { kNft, kLegacy };
std::string_view variantName(Variant v);  ///< "nft", "legacy"

/// A restore whose input is written while it is still being rendered: the tool parses the
/// start of it meanwhile, on the other core.
class RestoreStream {
 public:
  virtual ~RestoreStream() = default;
  /// Appends to the input (blocks while the tool is behind).
  virtual core::Result<void> write(std::string_view text) = 0;
  /// Ends the input without waiting: the tool parses and commits while the caller renders the
  /// next input. Default: nothing (finish() ends it).
  virtual void endInput() {}
  /// Ends the input and waits for the tool; errors as KernelIptables::restore. Call once.
  virtual core::Result<void> finish() = 0;
};

class KernelIptables {
 public:
  virtual ~KernelIptables() = default;
  /// `iptables-save -t TABLE` of `family`.
  virtual core::Result<std::string> save(net::Family family, Table table) = 0;
  /// The same, the output handed to `out` piece by piece as the tool writes it (a 10,000-Service
  /// nat table is tens of MB of text, never held whole). The default calls save().
  virtual core::Result<void> saveTo(net::Family family, Table table, const std::function<void(std::string_view)>& out);
  /// `iptables-restore --noflush -w` of `input` (several tables, each committed on its own).
  /// A refusal is an error of category kKernel whose message quotes the line the tool named.
  virtual core::Result<void> restore(net::Family family, std::string_view input) = 0;
  /// The same restore, with the input written piece by piece. The default collects the input
  /// and calls restore() in finish().
  virtual core::Result<std::unique_ptr<RestoreStream>> startRestore(net::Family family);
  /// Whether `chain` exists in `table` (the canary check).
  virtual core::Result<bool> chainExists(net::Family family, Table table, std::string_view chain) = 0;
  /// "iptables-nft", "iptables-legacy", "fake".
  virtual std::string describe() const = 0;
  /// The CPU the tools used since the last call, in user space and in the kernel (for
  /// iptables-nft, the kernel applying and validating each commit): a sync's summary says
  /// where its time went. Nothing for a kernel that runs no tools.
  struct ToolTimes {
    unsigned runs = 0;
    std::chrono::microseconds user{0};
    std::chrono::microseconds system{0};
  };
  virtual ToolTimes takeToolTimes() { return {}; }
  /// About how many rules one restore input of a full sync should carry at most (0: no limit).
  /// iptables-nft-restore 1.8.9 with --noflush spends time quadratic in the rules and chains of
  /// one input in userspace; iptables-legacy replaces the whole table on every commit, so there
  /// one input is cheapest. Larger chunks for larger tables (fewer kernel commits) cost more.
  /// The figures: BENCHMARKS.md, "Figures behind the code".
  virtual std::size_t restoreChunkRules() const { return 0; }
  /// Whether the owned nat chains may be written over netlink in the calling thread's network
  /// namespace (NftRuleBatch), as objects this variant's tools read as their own: iptables-nft
  /// 1.8.9, whose encoding NftRuleBatch reproduces (tests/kernel compares them byte for byte).
  virtual bool netlinkRules() { return false; }
  /// Whether every commit replaces each table it touches whole in the kernel (iptables-legacy:
  /// IPT_SO_SET_REPLACE re-checks every rule of the new table and destroys every rule of the
  /// old one), so a one-endpoint change costs what the table costs.
  virtual bool replacesWholeTables() const { return false; }
};

/// The programs of one variant, found in PATH or sbin: `iptables-nft-restore` and friends,
/// or, when only the generic names exist, `iptables-restore` if its version says it is that
/// variant. Error when a needed program is missing.
struct VariantTools {
  Variant variant = Variant::kNft;
  std::string save4, restore4, iptables4, save6, restore6, iptables6;  ///< v6 ones may be empty
};
core::Result<VariantTools> findVariantTools(Variant variant);

/// The variant a node already uses, as upstream's iptables wrapper decides: the one whose
/// mangle table holds kubelet's KUBE-IPTABLES-HINT or KUBE-KUBELET-CANARY chain, else the one
/// holding more rules, nft when tied (or when legacy is not installed).
Variant detectVariant(kernel::ProcessRunner& runner);

std::unique_ptr<KernelIptables> makeProcessKernel(VariantTools tools, kernel::ProcessRunner& runner);

/// --dry-run: the kernel interface that prints each restore input (`# iptables-restore
/// --noflush` and the input) instead of running the tool, and applies it to `inner`, which
/// answers every read: a dry run over an empty FakeIptables plans as on an empty node, and its
/// later syncs see what the earlier ones would have written. Never writes over netlink.
class PrintingIptables final : public KernelIptables {
 public:
  /// `name`: what describe() says (the variant the host would use).
  PrintingIptables(std::unique_ptr<KernelIptables> inner, std::FILE* out, std::string name);
  core::Result<std::string> save(net::Family family, Table table) override { return inner_->save(family, table); }
  core::Result<void> saveTo(net::Family family, Table table,
                            const std::function<void(std::string_view)>& out) override {
    return inner_->saveTo(family, table, out);
  }
  core::Result<void> restore(net::Family family, std::string_view input) override;
  core::Result<bool> chainExists(net::Family family, Table table, std::string_view chain) override {
    return inner_->chainExists(family, table, chain);
  }
  std::string describe() const override { return name_; }
  bool replacesWholeTables() const override { return inner_->replacesWholeTables(); }

 private:
  std::unique_ptr<KernelIptables> inner_;
  std::FILE* out_;
  std::string name_;
};

/// What a fresh kernel holds for the parameters iptables mode sets (route_localnet): a
/// kernel::FakeSysctls's start, for --dry-run and tests.
std::map<std::string, std::int64_t> freshSysctls();

/// Applies restore input to an in-memory ruleset (tests, and the benchmark's mirror checks).
class FakeIptables final : public KernelIptables {
 public:
  core::Result<std::string> save(net::Family family, Table table) override;
  core::Result<void> restore(net::Family family, std::string_view input) override;
  core::Result<bool> chainExists(net::Family family, Table table, std::string_view chain) override;
  std::string describe() const override { return "fake"; }
  std::size_t restoreChunkRules() const override { return chunkRules; }
  bool replacesWholeTables() const override { return wholeTables; }
  /// What restoreChunkRules says (tests of split full syncs).
  std::size_t chunkRules = 0;
  /// What replacesWholeTables says (tests of the legacy variant's warnings).
  bool wholeTables = false;

  /// The input of every restore, in order.
  std::vector<std::string> restores;
  /// Refuse the next restore (as the tool would, naming line `refuseLine`).
  bool refuseNext = false;
  std::size_t refuseLine = 1;
  /// The ruleset: per family and table, chain → rules ("-A" specs), in order; built-in chains
  /// INPUT, FORWARD, OUTPUT, PREROUTING, POSTROUTING exist from the start.
  struct Chain {
    std::string name;
    bool builtin = false;
    std::vector<std::string> rules;
  };
  std::vector<Chain>& chains(net::Family family, Table table);

 private:
  std::vector<Chain> tables_[2][3];
  bool initialized_[2][3] = {};
};

}  // namespace kproxy::iptables
