// KernelIptables over the tools: iptables-save and iptables-restore of one variant, run without a
// shell through the shared process runner; finding the variant and its programs.
#include "kproxy/iptables/kernel.h"

#include <algorithm>
#include <charconv>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "kproxy/backends/common/iptables_save.h"
#include "restore_refusal.h"

namespace kproxy::iptables {
namespace {

using kernel::ProcessOptions;
using kernel::ProcessResult;
using core::Error;
using core::ErrorCategory;

/// A tool run that is still going after this is killed and the sync fails (and is retried).
/// Upstream kube-proxy sets no limit; ours is only for a wedged tool, so it is far above the
/// slowest honest run measured: iptables-legacy at 30,000 Services x 10 endpoints, where one
/// restore takes over two minutes, nearly all of it the kernel replacing the nat table
/// (xt_recent's lookups; bench/iptables, BENCHMARKS.md). The lock wait is bounded separately
/// (-w 5).
constexpr auto kToolTimeout = std::chrono::minutes(15);
/// Measured at 10k services x 2 endpoints (bench/iptables): inputs of 1,000 / 2,500 / 5,000
/// rules cost 2.7 / 2.8 / 3.2 s in all, one input 87 s.
constexpr std::size_t kNftChunkRules = 2000;

bool isV6(net::Family family) { return family == net::Family::kIPv6; }

/// The line number iptables-restore names in its complaint ("line 7 failed", "Error occurred
/// at line: 7"), or 0.
std::size_t failedLine(std::string_view err) {
  for (std::string_view marker : {"line: ", "line "}) {
    for (auto at = err.find(marker); at != std::string_view::npos; at = err.find(marker, at + 1)) {
      std::size_t n = 0;
      const char* first = err.data() + at + marker.size();
      auto [ptr, ec] = std::from_chars(first, err.data() + err.size(), n);
      if (ec == std::errc() && ptr != first) return n;
    }
  }
  return 0;
}

std::string trimmed(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

void countToolRun(KernelIptables::ToolTimes& times, const kernel::ProcessResult& r) {
  ++times.runs;
  times.user += r.userTime;
  times.system += r.systemTime;
}

/// One iptables-restore run fed piece by piece. Keeps the input up to kQuotedInputMax, to
/// quote the line the tool refuses.
class ToolRestore final : public RestoreStream {
 public:
  ToolRestore(std::string tool, std::unique_ptr<kernel::ProcessStream> child, KernelIptables::ToolTimes& times)
      : tool_(std::move(tool)), child_(std::move(child)), times_(times) {}

  core::Result<void> write(std::string_view text) override {
    if (kept_ && input_.size() + text.size() <= kQuotedInputMax) {
      input_ += text;
    } else if (kept_) {
      kept_ = false;
      std::string().swap(input_);
    }
    return child_->write(text);
  }

  void endInput() override { child_->closeInput(); }

  core::Result<void> finish() override {
    auto r = child_->finish();
    if (!r) return std::unexpected(r.error());
    countToolRun(times_, *r);
    if (r->succeeded()) return {};
    std::string message = fmt::format("{} refused the input ({}): {}", tool_, r->exitCode, trimmed(r->err));
    if (auto n = failedLine(r->err); n != 0) {
      if (kept_)
        message += fmt::format("; line {}: {}", n, lineOf(input_, n));
      else
        message += fmt::format("; line {} (the input, over {} MiB, was not kept)", n, kQuotedInputMax >> 20);
    }
    return refused(std::move(message));
  }

 private:
  static constexpr std::size_t kQuotedInputMax = std::size_t{4} << 20;
  std::string tool_;
  std::unique_ptr<kernel::ProcessStream> child_;
  KernelIptables::ToolTimes& times_;
  std::string input_;
  bool kept_ = true;
};

class ProcessKernel final : public KernelIptables {
 public:
  ProcessKernel(VariantTools tools, kernel::ProcessRunner& runner) : tools_(std::move(tools)), runner_(runner) {}

  core::Result<std::string> save(net::Family family, Table table) override {
    std::string text;
    if (auto r = saveTo(family, table, [&text](std::string_view piece) { text.append(piece); }); !r)
      return std::unexpected(r.error());
    return text;
  }

  core::Result<void> saveTo(net::Family family, Table table, const std::function<void(std::string_view)>& out) override {
    const std::string& tool = isV6(family) ? tools_.save6 : tools_.save4;
    if (tool.empty()) return core::makeError(ErrorCategory::kProcess, "no ip6tables-save for IPv6");
    auto r = runner_.run({tool, "-t", std::string(tableName(table))}, ProcessOptions{{}, kToolTimeout, out});
    if (!r) return std::unexpected(r.error());
    countToolRun(times_, *r);
    if (!r->succeeded())
      return core::makeError(ErrorCategory::kKernel,
                             fmt::format("{} -t {} failed ({}): {}", tool, tableName(table), r->exitCode,
                                         trimmed(r->err)));
    if (!r->out.empty()) out(r->out);  // a runner that does not stream
    return {};
  }

  core::Result<void> restore(net::Family family, std::string_view input) override {
    auto stream = startRestore(family);
    if (!stream) return std::unexpected(stream.error());
    if (auto w = (*stream)->write(input); !w) return w;
    return (*stream)->finish();
  }

  core::Result<std::unique_ptr<RestoreStream>> startRestore(net::Family family) override {
    const std::string& tool = isV6(family) ? tools_.restore6 : tools_.restore4;
    if (tool.empty()) return core::makeError(ErrorCategory::kProcess, "no ip6tables-restore for IPv6");
    auto child = runner_.start({tool, "--noflush", "-w", "5"}, ProcessOptions{{}, kToolTimeout});
    if (!child) return std::unexpected(child.error());
    return std::make_unique<ToolRestore>(tool, std::move(*child), times_);
  }

  core::Result<bool> chainExists(net::Family family, Table table, std::string_view chain) override {
    const std::string& tool = isV6(family) ? tools_.iptables6 : tools_.iptables4;
    if (tool.empty()) return core::makeError(ErrorCategory::kProcess, "no ip6tables for IPv6");
    auto r = runner_.run({tool, "-w", "5", "-t", std::string(tableName(table)), "-S", std::string(chain)},
                         ProcessOptions{{}, kToolTimeout});
    if (!r) return std::unexpected(r.error());
    countToolRun(times_, *r);
    if (r->succeeded()) return true;
    // A missing chain is exit status 1 ("other problem"), whatever the message: iptables-nft
    // 1.8.9 says "chain `X' in table `mangle' is incompatible, use 'nft' tool." for one that
    // does not exist. As upstream's canary check, only a resource problem (4: the lock) or a
    // bad invocation is an error; a false "missing" costs one full sync, a missed flush more.
    if (r->termSignal == 0 && r->exitCode == 1) return false;
    if (r->err.find("No chain") != std::string::npos || r->err.find("does not exist") != std::string::npos)
      return false;
    return core::makeError(ErrorCategory::kKernel, fmt::format("{} -S {} failed ({}): {}", tool, chain,
                                                                    r->exitCode, trimmed(r->err)));
  }

  std::string describe() const override { return "iptables-" + std::string(variantName(tools_.variant)); }
  std::size_t restoreChunkRules() const override { return tools_.variant == Variant::kNft ? kNftChunkRules : 0; }
  bool replacesWholeTables() const override { return tools_.variant == Variant::kLegacy; }
  ToolTimes takeToolTimes() override { return std::exchange(times_, ToolTimes{}); }
  bool netlinkRules() override {
    if (tools_.variant != Variant::kNft) return false;
    if (!netlinkChecked_) {
      // "iptables-nft-restore v1.8.9 (nf_tables)": the version whose encoding NftRuleBatch was
      // compared with byte for byte (tests/kernel). Others encode some matches differently (1.8.7
      // has no native port match, so its save would print these rules without --dport); they
      // keep the tool until the same test has passed against them.
      netlinkChecked_ = true;
      auto r = runner_.run({tools_.restore4, "--version"}, ProcessOptions{{}, std::chrono::seconds(10)});
      netlink_ = r && r->succeeded() && r->out.find(" v1.8.9 ") != std::string::npos &&
                 r->out.find("(nf_tables)") != std::string::npos;
    }
    return netlink_;
  }

 private:
  VariantTools tools_;
  bool netlinkChecked_ = false, netlink_ = false;
  kernel::ProcessRunner& runner_;
  ToolTimes times_;  ///< since the last takeToolTimes()
};

/// Whether `tool --version` says it is `variant` ("iptables v1.8.9 (nf_tables)" / "(legacy)").
bool versionSays(const std::string& tool, Variant variant) {
  auto r = kernel::runProcess({tool, "--version"}, ProcessOptions{{}, std::chrono::seconds(10)});
  if (!r || !r->succeeded()) return false;
  return r->out.find(variant == Variant::kNft ? "nf_tables" : "legacy") != std::string::npos;
}

/// KernelIptables::startRestore's default: collected, restored in finish().
class CollectedRestore final : public RestoreStream {
 public:
  CollectedRestore(KernelIptables& kernel, net::Family family) : kernel_(kernel), family_(family) {}
  core::Result<void> write(std::string_view text) override {
    input_ += text;
    return {};
  }
  core::Result<void> finish() override { return kernel_.restore(family_, input_); }

 private:
  KernelIptables& kernel_;
  net::Family family_;
  std::string input_;
};

}  // namespace

core::Result<std::unique_ptr<RestoreStream>> KernelIptables::startRestore(net::Family family) {
  return std::make_unique<CollectedRestore>(*this, family);
}

core::Result<void> KernelIptables::saveTo(net::Family family, Table table,
                                          const std::function<void(std::string_view)>& out) {
  auto text = save(family, table);
  if (!text) return std::unexpected(text.error());
  out(*text);
  return {};
}

std::string_view variantName(Variant v) { return v == Variant::kLegacy ? "legacy" : "nft"; }

core::Result<VariantTools> findVariantTools(Variant variant) {
  VariantTools t;
  t.variant = variant;
  const std::string v(variantName(variant));
  auto find = [&](const std::string& base) -> std::string {
    if (auto p = kernel::findExecutable(base.substr(0, base.find('-')) + "-" + v + base.substr(base.find('-'))))
      return *p;
    if (auto generic = kernel::findExecutable(base); generic && versionSays(*generic, variant)) return *generic;
    return {};
  };
  auto plain = [&](const std::string& base) -> std::string {
    if (auto p = kernel::findExecutable(base + "-" + v)) return *p;
    if (auto generic = kernel::findExecutable(base); generic && versionSays(*generic, variant)) return *generic;
    return {};
  };
  t.save4 = find("iptables-save");
  t.restore4 = find("iptables-restore");
  t.iptables4 = plain("iptables");
  t.save6 = find("ip6tables-save");
  t.restore6 = find("ip6tables-restore");
  t.iptables6 = plain("ip6tables");
  if (t.save4.empty() || t.restore4.empty() || t.iptables4.empty())
    return core::makeError(ErrorCategory::kProcess,
                                 fmt::format("iptables: the {0} variant's tools (iptables-{0}-restore, iptables-{0}-save, "
                                             "iptables-{0}) are not installed",
                                             v));
  return t;
}

Variant detectVariant(kernel::ProcessRunner& runner) {
  struct Seen {
    bool hint = false;
    std::size_t rules = 0;
    bool available = false;
  };
  auto look = [&](Variant variant) {
    Seen seen;
    auto tools = findVariantTools(variant);
    if (!tools) return seen;
    seen.available = true;
    for (const auto& tool : {tools->save4, tools->save6}) {
      if (tool.empty()) continue;
      auto r = runner.run({tool}, ProcessOptions{{}, std::chrono::seconds(30)});
      if (!r || !r->succeeded()) continue;
      if (r->out.find(":KUBE-IPTABLES-HINT ") != std::string::npos ||
          r->out.find(":KUBE-KUBELET-CANARY ") != std::string::npos)
        seen.hint = true;
      std::size_t at = 0;
      while ((at = r->out.find("\n-A ", at)) != std::string::npos) {
        ++seen.rules;
        ++at;
      }
    }
    return seen;
  };
  const Seen legacy = look(Variant::kLegacy);
  const Seen nft = look(Variant::kNft);
  if (!legacy.available) return Variant::kNft;
  if (!nft.available) return Variant::kLegacy;
  if (legacy.hint != nft.hint) return legacy.hint ? Variant::kLegacy : Variant::kNft;
  return legacy.rules > nft.rules ? Variant::kLegacy : Variant::kNft;
}

std::unique_ptr<KernelIptables> makeProcessKernel(VariantTools tools, kernel::ProcessRunner& runner) {
  return std::make_unique<ProcessKernel>(std::move(tools), runner);
}

}  // namespace kproxy::iptables
