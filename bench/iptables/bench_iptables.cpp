// kproxy-bench-iptables: the iptables backend's full and one-endpoint-change syncs at scale, per
// variant (iptables-nft, iptables-legacy), against baselines measured in the same run:
//   - full sync: `iptables-restore` of the backend's full-sync text as one input into an empty
//     namespace (the floor: what the tool and the kernel cost for that text), without and with
//     --noflush (iptables-nft 1.8.9's --noflush is quadratic in the input's size, so the backend
//     splits its full sync for that variant; the one-input --noflush floor shows what that saves);
//   - one-endpoint change: `iptables-restore --noflush` of the backend's partial input (the floor:
//     the changed service's chains only) and of upstream kube-proxy's partial-sync input for the
//     same change (the service's chains plus every dispatch and fixed chain of filter and nat
//     rewritten in full, as upstream's proxier writes on every partial sync);
//   - a restart: a new backend's full sync over the unchanged kernel (writes nothing; its cost is
//     reading the tables back);
//   - with iptables-legacy, after each change: the kernel's replacement of the unchanged nat
//     table (IPT_SO_SET_REPLACE of the entries IPT_SO_GET_ENTRIES returned), the least any
//     legacy writer pays for a change, since the kernel takes only whole tables;
//   - with --netlink-floor (iptables-nft): the kernel's half of writing iptables-nft's rules over
//     netlink instead of through the tool: the floor's tables dumped and sent back as one batch
//     into another fresh namespace (netlink_replay.h), checked by comparing iptables-nft-save of
//     both namespaces.
// Every measurement runs in forked processes inside a fresh network namespace (needs root).
// Baselines go through the same process runner (pipe to stdin) as the backend's own restores.
//
//   kproxy-bench-iptables [--variants nft,legacy] [--services 1000,10000,30000] [--endpoints 2,10]
//                         [--max-endpoints 100000] [--full-repeat 3] [--change-repeat 11] [--ipv6]
//                         [--no-affinity]
//                         [--noflush-floor-max N] [--chunk-rules N] [--netlink-floor] [--netlink on|off]
//                         [--netlink-batch N]

// netinet/in.h before the kernel's header, which would otherwise define in_addr itself.
#include <netinet/in.h>
// clang-format off
#include <linux/netfilter_ipv4/ip_tables.h>
// clang-format on
#include <fcntl.h>
#include <sched.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "../common/sync_bench.h"
#include "../nftables/bench_args.h"
#include "netlink_replay.h"
#include "kproxy/backends/common/chain_names.h"
#include "kproxy/iptables/backend.h"
#include "kproxy/iptables/kernel.h"
#include "kproxy/kernel/process.h"

using namespace kproxy;
using namespace kproxy::iptables;
namespace fixtures = kproxy::nftables::testing;

namespace {

using bench::Clock;
using bench::currentRssMiB;
using bench::GeneratedSnapshot;
using bench::msSince;
using bench::peakRssMiB;

constexpr auto kToolTimeout = std::chrono::minutes(10);
constexpr int kMaxRepeat = 64;

std::string loadAverage() {
  double l[3] = {};
  if (getloadavg(l, 3) != 3) return "?";
  return fmt::format("{:.2f} {:.2f} {:.2f}", l[0], l[1], l[2]);
}

/// Runs `body` in a forked child; with `newNetns` the child first unshares its network
/// namespace (a grandchild forked by `body` stays in it). Returns whether it exited 0.
template <typename Fn>
bool inChild(bool newNetns, Fn&& body) {
  return bench::inChild(newNetns ? CLONE_NEWNET : 0, std::forward<Fn>(body));
}

/// The real kernel, timing its save and restore runs (the parts of a sync spent in the tools).
class TimedKernel final : public KernelIptables {
 public:
  explicit TimedKernel(std::unique_ptr<KernelIptables> inner) : inner_(std::move(inner)) {}
  core::Result<std::string> save(net::Family family, Table table) override {
    auto t = Clock::now();
    auto r = inner_->save(family, table);
    saveMs += msSince(t);
    return r;
  }
  core::Result<void> restore(net::Family family, std::string_view input) override {
    auto t = Clock::now();
    auto r = inner_->restore(family, input);
    restoreMs += msSince(t);
    restoreBytes += input.size();
    ++restores;
    return r;
  }
  /// A streamed restore: timed from its start to its end (the tool runs meanwhile, while the
  /// backend renders the rest of the input).
  core::Result<std::unique_ptr<RestoreStream>> startRestore(net::Family family) override {
    auto inner = inner_->startRestore(family);
    if (!inner) return std::unexpected(inner.error());
    ++restores;
    return std::make_unique<Timed>(*this, std::move(*inner));
  }
  core::Result<bool> chainExists(net::Family family, Table table, std::string_view chain) override {
    return inner_->chainExists(family, table, chain);
  }
  std::string describe() const override { return inner_->describe(); }
  std::size_t restoreChunkRules() const override {
    return chunkRules != 0 ? chunkRules : inner_->restoreChunkRules();
  }
  bool netlinkRules() override { return netlink && inner_->netlinkRules(); }
  bool replacesWholeTables() const override { return inner_->replacesWholeTables(); }
  void reset() {
    saveMs = restoreMs = 0;
    restoreBytes = restores = 0;
  }

  std::size_t chunkRules = 0;  ///< overrides the inner adapter's when not 0
  bool netlink = true;         ///< off: iptables-nft's full syncs through the tool only
  double saveMs = 0;
  double restoreMs = 0;
  std::size_t restoreBytes = 0;  ///< of the inputs since reset()
  std::size_t restores = 0;

 private:
  class Timed final : public RestoreStream {
   public:
    Timed(TimedKernel& kernel, std::unique_ptr<RestoreStream> inner)
        : kernel_(kernel), inner_(std::move(inner)), started_(Clock::now()) {}
    core::Result<void> write(std::string_view text) override {
      kernel_.restoreBytes += text.size();
      return inner_->write(text);
    }
    void endInput() override { inner_->endInput(); }
    core::Result<void> finish() override {
      auto r = inner_->finish();
      kernel_.restoreMs += msSince(started_);
      return r;
    }

   private:
    TimedKernel& kernel_;
    std::unique_ptr<RestoreStream> inner_;
    Clock::time_point started_;
  };

  std::unique_ptr<KernelIptables> inner_;
};

kernel::SystemProcessRunner& runner() {
  static kernel::SystemProcessRunner r;
  return r;
}

/// `iptables-restore --noflush -w 5` of `input` by the variant's tool, as the backend runs it
/// (without --noflush when `flush`); milliseconds, or -1 when the tool refused it. `userMs` and
/// `systemMs`, when given, receive the tool's CPU time (system: mostly the kernel's commit).
double timeRestore(const VariantTools& tools, std::string_view input, bool flush = false, double* userMs = nullptr,
                   double* systemMs = nullptr) {
  std::vector<std::string> argv{tools.restore4, "--noflush", "-w", "5"};
  if (flush) argv.erase(argv.begin() + 1);
  auto t = Clock::now();
  auto r = runner().run(argv, kernel::ProcessOptions{input, kToolTimeout});
  const double ms = msSince(t);
  if (!r || !r->succeeded()) {
    std::fprintf(stderr, "  restore refused: %s\n", r ? r->err.c_str() : r.error().message().c_str());
    return -1;
  }
  if (userMs) *userMs = static_cast<double>(r->userTime.count()) / 1e3;
  if (systemMs) *systemMs = static_cast<double>(r->systemTime.count()) / 1e3;
  return ms;
}

/// The kernel's replacement of this namespace's IPv4 `table` (iptables-legacy) by the entries it
/// holds, unchanged: IPT_SO_GET_INFO and IPT_SO_GET_ENTRIES, then IPT_SO_SET_REPLACE of the same
/// entries, timed alone. Every legacy writer (iptables-restore through libiptc, or any other)
/// ends in this call with the whole table, so its time is the floor of a one-endpoint change.
/// Holds the xtables lock meanwhile, as the tool does. Milliseconds, or -1 (and why on stderr).
double timeKernelReplace(const char* table) {
  const int lock = open("/run/xtables.lock", O_CREAT | O_RDWR | O_CLOEXEC, 0600);
  if (lock < 0 || flock(lock, LOCK_EX) != 0) {
    std::perror("  kernel replace: /run/xtables.lock");
    if (lock >= 0) close(lock);
    return -1;
  }
  double ms = -1;
  const int fd = socket(AF_INET, SOCK_RAW | SOCK_CLOEXEC, IPPROTO_RAW);
  ipt_getinfo info{};
  std::snprintf(info.name, sizeof info.name, "%s", table);
  socklen_t length = sizeof info;
  if (fd < 0 || getsockopt(fd, IPPROTO_IP, IPT_SO_GET_INFO, &info, &length) != 0) {
    std::perror("  kernel replace: IPT_SO_GET_INFO");
  } else {
    std::vector<char> got(sizeof(ipt_get_entries) + info.size);
    auto* entries = reinterpret_cast<ipt_get_entries*>(got.data());
    std::snprintf(entries->name, sizeof entries->name, "%s", table);
    entries->size = info.size;
    length = static_cast<socklen_t>(got.size());
    std::vector<char> replaceBuffer(sizeof(ipt_replace) + info.size);
    std::vector<xt_counters> counters(info.num_entries);
    if (getsockopt(fd, IPPROTO_IP, IPT_SO_GET_ENTRIES, entries, &length) != 0) {
      std::perror("  kernel replace: IPT_SO_GET_ENTRIES");
    } else {
      auto* replace = reinterpret_cast<ipt_replace*>(replaceBuffer.data());
      std::snprintf(replace->name, sizeof replace->name, "%s", table);
      replace->valid_hooks = info.valid_hooks;
      replace->num_entries = info.num_entries;
      replace->size = info.size;
      std::copy(std::begin(info.hook_entry), std::end(info.hook_entry), std::begin(replace->hook_entry));
      std::copy(std::begin(info.underflow), std::end(info.underflow), std::begin(replace->underflow));
      replace->num_counters = info.num_entries;
      replace->counters = counters.data();
      std::memcpy(replace->entries, entries->entrytable, info.size);
      const auto t = Clock::now();
      if (setsockopt(fd, IPPROTO_IP, IPT_SO_SET_REPLACE, replace, static_cast<socklen_t>(replaceBuffer.size())) != 0)
        std::perror("  kernel replace: IPT_SO_SET_REPLACE");
      else
        ms = msSince(t);
    }
  }
  if (fd >= 0) close(fd);
  close(lock);
  return ms;
}

std::string_view chainOfLine(std::string_view line) {
  // ":NAME - [0:0]" or "-A NAME ...".
  std::string_view rest = line.front() == ':' ? line.substr(1) : line.substr(3);
  return rest.substr(0, rest.find(' '));
}

/// One table's part of a restore input, split into chain declarations, appended rules and the
/// other commands (-I, -D, -X), in order.
struct TableText {
  std::string declare, rules, other;
};
std::map<std::string, TableText> splitByTable(std::string_view input) {
  std::map<std::string, TableText> out;
  TableText* current = nullptr;
  std::istringstream in{std::string(input)};
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line.front() == '#' || line == "COMMIT") continue;
    if (line.front() == '*') {
      current = &out[line.substr(1)];
      continue;
    }
    if (current == nullptr) continue;
    std::string& to = line.front() == ':' ? current->declare : line.starts_with("-A ") ? current->rules : current->other;
    to += line;
    to += '\n';
  }
  return out;
}

/// Upstream kube-proxy's iptables-restore input for a partial sync that changes one service
/// (pkg/proxy/iptables/proxier.go): filter and nat, every shared chain (KUBE-SERVICES,
/// KUBE-NODEPORTS, KUBE-EXTERNAL-SERVICES, KUBE-PROXY-FIREWALL, KUBE-FORWARD, KUBE-POSTROUTING,
/// KUBE-MARK-MASQ) declared and written with all its rules, plus the changed service's chains
/// and the deletion of its stale ones. `full` is the backend's full-sync input (every chain);
/// `partial` its input for the change (the service's chains only).
std::string upstreamPartialInput(std::string_view full, std::string_view partial) {
  auto whole = splitByTable(full);
  auto change = splitByTable(partial);
  std::string out;
  for (std::string table : {"filter", "nat"}) {
    std::string declare, rules;
    auto keep = [](std::string_view line) {
      auto chain = chainOfLine(line);
      return chain.starts_with("KUBE-") && !backends::isServiceChainName(chain) && chain != "KUBE-PROXY-CANARY";
    };
    std::istringstream d(whole[table].declare), r(whole[table].rules);
    std::string line;
    while (std::getline(d, line))
      if (keep(line)) declare += line + "\n";
    while (std::getline(r, line))
      if (keep(line)) rules += line + "\n";
    const TableText& c = change[table];
    std::string removals;  // -X of the service's stale chains; its -I/-D are covered by the rewrite
    std::istringstream o(c.other);
    while (std::getline(o, line))
      if (line.starts_with("-X ")) removals += line + "\n";
    out += "*" + table + "\n" + declare + c.declare + rules + c.rules + removals + "COMMIT\n";
  }
  return out;
}

struct Figures {
  bool fullOk[kMaxRepeat];
  double fullMs[kMaxRepeat], fullRestoreMs[kMaxRepeat], fullSaveMs[kMaxRepeat], floorFullMs[kMaxRepeat],
      flushFloorFullMs[kMaxRepeat];
  long rssMiB, baseRssMiB, toolRssMiB;
  unsigned long fullOps, fullBytes;
  bool changeOk;
  double changeMs[kMaxRepeat], changeRestoreMs[kMaxRepeat], floorChangeMs[kMaxRepeat],
      upstreamChangeMs[kMaxRepeat];
  double kernelReplaceMs[kMaxRepeat];  ///< iptables-legacy: the nat table replaced, unchanged
  unsigned long changeOps, changeBytes, upstreamBytes;
  bool restartOk;
  double restartMs, restartSaveMs;
  unsigned long restartOps;
  long restartRssMiB;
  /// --netlink-floor: the replay's wall and system CPU time; whether the replayed namespace
  /// saved the same text as the floor's (1), not (0), or was not checked (-1).
  double netlinkMs[kMaxRepeat], netlinkSysMs[kMaxRepeat];
  double flushFloorUserMs[kMaxRepeat], flushFloorSysMs[kMaxRepeat];  ///< the flushing floor's tool CPU
  int netlinkSame;
  unsigned long netlinkBytes, netlinkObjects;
};

struct Stat {
  double median = -1, min = -1, max = -1;
};
Stat summarize(const double* values, int n) {
  std::vector<double> v;
  for (int i = 0; i < n; ++i)
    if (values[i] >= 0) v.push_back(values[i]);
  if (v.empty()) return {};
  std::sort(v.begin(), v.end());
  return {v[v.size() / 2], v.front(), v.back()};
}
std::string show(const Stat& s, int decimals) {
  if (s.median < 0) return "n/a";
  return fmt::format("{:.{}f} [{:.{}f}-{:.{}f}]", s.median, decimals, s.min, decimals, s.max, decimals);
}

struct Config {
  VariantTools tools;
  int services = 0;
  int endpoints = 0;
  int fullRepeat = 3;
  int changeRepeat = 11;
  bool ipv6 = false;
  /// Every tenth service with ClientIP session affinity (off: --no-affinity).
  bool affinity = true;
  /// Time `iptables-restore --noflush` of the whole full-sync text as one input only up to this
  /// many endpoints in all (iptables-nft 1.8.9 takes minutes beyond).
  long noflushFloorMax = 1000000;
  /// Overrides KernelIptables::restoreChunkRules (calibration); 0 keeps the adapter's.
  std::size_t chunkRules = 0;
  /// Measure the netlink replay of the floor's tables (iptables-nft only).
  bool netlinkFloor = false;
  /// Let the backend write iptables-nft's service chains over netlink (BackendSettings::netlinkRules).
  bool netlink = true;
  /// Overrides BackendSettings::netlinkBatchRules when not 0 (calibration).
  std::size_t netlinkBatch = 0;
};

std::unique_ptr<IptablesBackend> makeBackend(const Config& c, TimedKernel*& timed) {
  BackendSettings settings;
  settings.ipv6 = c.ipv6;
  if (c.netlinkBatch != 0) settings.netlinkBatchRules = c.netlinkBatch;
  auto kernel = std::make_unique<TimedKernel>(makeProcessKernel(c.tools, runner()));
  timed = kernel.get();
  timed->chunkRules = c.chunkRules;
  timed->netlink = c.netlink;
  return std::make_unique<IptablesBackend>(sdk::Host(nullptr), settings, std::move(kernel),
                                           kernel::makeFileSysctls());
}

/// The one-endpoint changes of service `index`: its last endpoint replaced by an address no
/// other service uses, then put back; the backend's forward syncs are timed, and the floor and
/// upstream inputs for the same change are restored (forward timed, back untimed) in turn.
bool measureChanges(const Config& c, GeneratedSnapshot& snap, IptablesBackend& backend, TimedKernel& timed,
                    const std::string& fullInput, Figures& fig) {
  const int index = c.services / 2 + 1;  // not a tenth: no session affinity
  auto& port = snap.port(index);
  const auto original = port.clusterEndpoints;
  auto replaced = original;
  replaced.back() = fixtures::endpoint("10.200.0.1", 8080);
  const sdk::ChangedKey key{net::Family::kIPv4, port.key};

  auto syncTo = [&](const std::vector<sdk::Endpoint>& eps, double* ms, double* restoreMs) -> std::optional<std::string> {
    fixtures::setEndpoints(port, eps);
    timed.reset();
    auto t = Clock::now();
    auto r = backend.syncFrom(snap, {key}, false);
    if (ms) *ms = msSince(t);
    if (restoreMs) *restoreMs = timed.restoreMs;
    if (!r) {
      std::fprintf(stderr, "  change sync failed: %s\n", r.error().message.c_str());
      return std::nullopt;
    }
    fig.changeOps = r->operations;
    return backend.lastRestore(net::Family::kIPv4);
  };
  // Warm-up round trip, which also yields the backend's inputs for both directions.
  auto forward = syncTo(replaced, nullptr, nullptr);
  if (!forward) return false;
  auto back = syncTo(original, nullptr, nullptr);
  if (!back) return false;
  const std::string upForward = upstreamPartialInput(fullInput, *forward);
  const std::string upBack = upstreamPartialInput(fullInput, *back);
  fig.changeBytes = forward->size();
  fig.upstreamBytes = upForward.size();
  std::fprintf(stderr, "  change input (%zu bytes):\n%s  upstream's input: %zu bytes, %zu lines\n", forward->size(),
               forward->c_str(), upForward.size(),
               static_cast<std::size_t>(std::count(upForward.begin(), upForward.end(), '\n')));

  for (int r = 0; r < c.changeRepeat; ++r) {
    if (!syncTo(replaced, &fig.changeMs[r], &fig.changeRestoreMs[r])) return false;
    if (!syncTo(original, nullptr, nullptr)) return false;
    fig.floorChangeMs[r] = timeRestore(c.tools, *forward);
    if (timeRestore(c.tools, *back) < 0) return false;
    fig.upstreamChangeMs[r] = timeRestore(c.tools, upForward);
    if (timeRestore(c.tools, upBack) < 0) return false;
    fig.kernelReplaceMs[r] = c.tools.variant == Variant::kLegacy ? timeKernelReplace("nat") : -1;
  }
  return true;
}

/// `iptables-save` of this namespace without its comment lines (which carry the time).
std::optional<std::string> savedRules(const VariantTools& tools) {
  auto r = runner().run({tools.save4}, kernel::ProcessOptions{{}, kToolTimeout});
  if (!r || !r->succeeded()) return std::nullopt;
  std::string out;
  std::istringstream in(r->out);
  std::string line;
  while (std::getline(in, line))
    if (!line.starts_with("#")) out += line + "\n";
  return out;
}

double cpuMs(const timeval& tv) { return static_cast<double>(tv.tv_sec) * 1e3 + static_cast<double>(tv.tv_usec) / 1e3; }

/// In the floor's namespace: dumps its tables, then sends them back as one batch into another
/// fresh namespace, timed; the first repetition compares both namespaces' saved rules.
void measureNetlinkReplay(const Config& c, Figures& fig, int r) {
  auto replay = bench::dumpIpv4Ruleset();
  if (!replay) {
    std::fprintf(stderr, "  netlink dump failed: %s\n", replay.error().message().c_str());
    return;
  }
  fig.netlinkBytes = replay->messages.size();
  fig.netlinkObjects = replay->tables + replay->chains + replay->rules;
  std::optional<std::string> original;
  if (r == 0) original = savedRules(c.tools);
  inChild(true, [&]() -> int {
    rusage before{}, after{};
    getrusage(RUSAGE_SELF, &before);
    auto t = Clock::now();
    auto sent = bench::sendReplay(*replay);
    const double ms = msSince(t);
    getrusage(RUSAGE_SELF, &after);
    if (!sent) {
      std::fprintf(stderr, "  netlink replay failed: %s\n", sent.error().message().c_str());
      return 1;
    }
    fig.netlinkMs[r] = ms;
    fig.netlinkSysMs[r] = cpuMs(after.ru_stime) - cpuMs(before.ru_stime);
    if (r != 0) return 0;
    auto replayed = savedRules(c.tools);
    fig.netlinkSame = original && replayed && *original == *replayed ? 1 : 0;
    if (fig.netlinkSame == 0 && original && replayed) {
      std::istringstream a(*original), b(*replayed);
      std::string la, lb;
      for (int line = 1, shown = 0; shown < 5; ++line) {
        const bool inA = static_cast<bool>(std::getline(a, la)), inB = static_cast<bool>(std::getline(b, lb));
        if (!inA && !inB) break;
        if (!inA) la = "<end>";
        if (!inB) lb = "<end>";
        if (la != lb) {
          std::fprintf(stderr, "  save differs at line %d:\n    floor:    %s\n    replayed: %s\n", line, la.c_str(),
                       lb.c_str());
          ++shown;
        }
      }
    }
    return 0;
  });
}

void runConfig(const Config& c, Figures& fig) {
  const std::string fullPath = fmt::format("/tmp/kproxy-bench-iptables-{}-{}-{}.txt", getpid(), c.services, c.endpoints);
  // The full-sync text as one input (what the backend writes into an empty kernel when it does
  // not split it), from the same backend over an in-memory kernel, for the floors and for
  // upstream's partial-sync input.
  inChild(false, [&]() -> int {
    GeneratedSnapshot snap(c.services, c.endpoints, c.affinity);
    BackendSettings settings;
    settings.lastRestoreKept = SIZE_MAX;  // the baselines restore the same text
    settings.ipv6 = false;
    IptablesBackend backend(sdk::Host(nullptr), settings, std::make_unique<FakeIptables>(),
                            std::make_unique<kernel::FakeSysctls>(freshSysctls()));
    if (!backend.syncFrom(snap, {}, true)) return 1;
    std::ofstream(fullPath) << backend.lastRestore(net::Family::kIPv4);
    return 0;
  });
  auto readFull = [&] {
    std::ifstream in(fullPath);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  };
  const bool noflushFloor = static_cast<long>(c.services) * c.endpoints <= c.noflushFloorMax;
  for (int r = 0; r < c.fullRepeat; ++r) {
    fig.fullOk[r] = inChild(true, [&]() -> int {
      // The full sync (and, the first time, the changes) in a worker forked from this small
      // process, so that its peak resident set is the sync's; the restart in another worker.
      bool ok = inChild(false, [&]() -> int {
        GeneratedSnapshot snap(c.services, c.endpoints, c.affinity);
        fig.baseRssMiB = currentRssMiB();
        TimedKernel* timed = nullptr;
        auto backend = makeBackend(c, timed);
        auto t = Clock::now();
        auto full = backend->syncFrom(snap, {}, true);
        fig.fullMs[r] = msSince(t);
        fig.fullRestoreMs[r] = timed->restoreMs;
        fig.fullSaveMs[r] = timed->saveMs;
        if (r == 0) {
          fig.rssMiB = peakRssMiB(RUSAGE_SELF);
          fig.toolRssMiB = peakRssMiB(RUSAGE_CHILDREN);
        }
        if (!full) {
          std::fprintf(stderr, "  full sync failed: %s\n", full.error().message.c_str());
          return 1;
        }
        if (r != 0) return 0;
        fig.fullOps = full->operations;
        fig.fullBytes = timed->restoreBytes;
        const std::string fullInput = readFull();
        std::fprintf(stderr, "  %s; %zu restore inputs\n", full->summary.c_str(), timed->restores);
        fig.changeOk = measureChanges(c, snap, *backend, *timed, fullInput, fig);
        return 0;
      });
      if (!ok || r != 0) return ok ? 0 : 1;
      fig.restartOk = inChild(false, [&]() -> int {
        GeneratedSnapshot snap(c.services, c.endpoints, c.affinity);
        TimedKernel* timed = nullptr;
        auto backend = makeBackend(c, timed);
        auto t = Clock::now();
        auto resync = backend->syncFrom(snap, {}, true);
        fig.restartMs = msSince(t);
        fig.restartSaveMs = timed->saveMs;
        fig.restartRssMiB = peakRssMiB(RUSAGE_SELF);
        if (!resync) {
          std::fprintf(stderr, "  restart sync failed: %s\n", resync.error().message.c_str());
          return 1;
        }
        fig.restartOps = resync->operations;
        if (resync->operations != 0)
          std::fprintf(stderr, "  restart wrote %zu changes:\n%s", resync->operations,
                       backend->lastRestore(net::Family::kIPv4).substr(0, 2000).c_str());
        return 0;
      });
      return 0;
    });
    // The floors: the same text restored by the tool alone into an empty namespace, as one
    // input, with --noflush (as the backend runs the tool) and without (the table is empty,
    // so that flushes nothing).
    fig.floorFullMs[r] = fig.flushFloorFullMs[r] = fig.netlinkMs[r] = fig.netlinkSysMs[r] = -1;
    inChild(true, [&]() -> int {
      fig.flushFloorFullMs[r] =
          timeRestore(c.tools, readFull(), true, &fig.flushFloorUserMs[r], &fig.flushFloorSysMs[r]);
      if (c.netlinkFloor && fig.flushFloorFullMs[r] >= 0) measureNetlinkReplay(c, fig, r);
      return 0;
    });
    if (noflushFloor)
      inChild(true, [&]() -> int {
        fig.floorFullMs[r] = timeRestore(c.tools, readFull());
        return 0;
      });
  }
  std::remove(fullPath.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> variants{"nft", "legacy"};
  std::vector<int> sizes{1000, 10000, 30000};
  std::vector<int> endpoints{2, 10};
  long maxEndpoints = 100000;
  Config base;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--variants" && i + 1 < argc) {
      variants.clear();
      std::string s = argv[++i];
      for (std::size_t at = 0; at <= s.size();) {
        auto comma = std::min(s.find(',', at), s.size());
        variants.push_back(s.substr(at, comma - at));
        at = comma + 1;
      }
    } else if (a == "--services" && i + 1 < argc) {
      sizes = bench::parseList(argv[++i]);
    } else if (a == "--endpoints" && i + 1 < argc) {
      endpoints = bench::parseList(argv[++i]);
    } else if (a == "--max-endpoints" && i + 1 < argc) {
      maxEndpoints = std::atol(argv[++i]);
    } else if (a == "--full-repeat" && i + 1 < argc) {
      base.fullRepeat = std::clamp(std::atoi(argv[++i]), 1, kMaxRepeat);
    } else if (a == "--change-repeat" && i + 1 < argc) {
      base.changeRepeat = std::clamp(std::atoi(argv[++i]), 1, kMaxRepeat);
    } else if (a == "--noflush-floor-max" && i + 1 < argc) {
      base.noflushFloorMax = std::atol(argv[++i]);
    } else if (a == "--netlink" && i + 1 < argc) {
      const std::string v = argv[++i];
      if (v != "on" && v != "off") {
        std::fprintf(stderr, "--netlink takes on or off\n");
        return 2;
      }
      base.netlink = v == "on";
    } else if (a == "--netlink-batch" && i + 1 < argc) {
      base.netlinkBatch = static_cast<std::size_t>(std::atol(argv[++i]));
    } else if (a == "--chunk-rules" && i + 1 < argc) {
      base.chunkRules = static_cast<std::size_t>(std::atol(argv[++i]));
    } else if (a == "--netlink-floor") {
      base.netlinkFloor = true;
    } else if (a == "--no-affinity") {
      base.affinity = false;
    } else if (a == "--ipv6") {
      base.ipv6 = true;
    } else {
      std::fprintf(stderr,
                   "usage: %s [--variants nft,legacy] [--services 1000,10000,30000] [--endpoints 2,10]\n"
                   "          [--max-endpoints N (skip sizes with more endpoints in all; default 100000)]\n"
                   "          [--full-repeat N] [--change-repeat N] [--ipv6]\n"
                   "          [--no-affinity (no service with session affinity; else every tenth)]\n"
                   "          [--noflush-floor-max N (time the one-input --noflush floor up to N endpoints)]\n"
                   "          [--chunk-rules N (iptables-nft restore chunk at 10,000 chains; calibration)]\n"
                   "          [--netlink on|off (iptables-nft full syncs write service chains over netlink; on)]\n"
                   "          [--netlink-batch N (rules per netlink transaction; calibration)]\n"
                   "          [--netlink-floor (iptables-nft: time the floor's tables sent back over netlink)]\n",
                   argv[0]);
      return 2;
    }
  }
  if (geteuid() != 0) {
    std::fprintf(stderr, "kproxy-bench-iptables needs root (it creates network namespaces)\n");
    return 1;
  }
  // Results come back from the forked workers through one shared page set.
  auto* fig = static_cast<Figures*>(
      mmap(nullptr, sizeof(Figures), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  if (fig == MAP_FAILED) {
    std::perror("mmap");
    return 1;
  }
  std::printf("# full and change: median [min-max] ms; full of %d runs, change of %d; session affinity on %s; "
              "load at start: %s\n",
              base.fullRepeat, base.changeRepeat, base.affinity ? "every tenth service" : "no service",
              loadAverage().c_str());
  std::printf("%-7s %-6s %-3s | %-22s %-22s %-22s %-22s %5s | %-19s %-19s %-19s %-22s %5s %5s | %7s %7s | %9s %9s %4s %7s\n",
              "variant", "svcs", "eps", "full_ms", "full_restore_ms", "floor_flush_ms", "floor_noflush_ms", "x",
              "change_ms",
              "change_restore_ms", "floor_change_ms", "upstream_change_ms", "x_fl", "up/x", "rss_MiB", "tool_MiB",
              "restart_ms", "save_ms", "ops", "rss_MiB");
  for (const auto& v : variants) {
    Config c = base;
    auto tools = findVariantTools(v == "legacy" ? Variant::kLegacy : Variant::kNft);
    if (!tools) {
      std::printf("%-7s skipped: %s\n", v.c_str(), tools.error().message().c_str());
      continue;
    }
    c.tools = *tools;
    c.netlinkFloor = base.netlinkFloor && tools->variant == Variant::kNft;
    for (int n : sizes) {
      for (int eps : endpoints) {
        if (static_cast<long>(n) * eps > maxEndpoints) {
          std::printf("%-7s %-6d %-3d | skipped: %ld endpoints > --max-endpoints %ld\n", v.c_str(), n, eps,
                      static_cast<long>(n) * eps, maxEndpoints);
          continue;
        }
        c.services = n;
        c.endpoints = eps;
        *fig = Figures{};
        fig->netlinkSame = -1;
        std::fprintf(stderr, "[%s %d x %d] load %s\n", v.c_str(), n, eps, loadAverage().c_str());
        runConfig(c, *fig);
        const Stat full = summarize(fig->fullMs, c.fullRepeat), fullRestore = summarize(fig->fullRestoreMs, c.fullRepeat),
                   floorFull = summarize(fig->floorFullMs, c.fullRepeat),
                   flushFloorFull = summarize(fig->flushFloorFullMs, c.fullRepeat);
        const Stat change = summarize(fig->changeMs, fig->changeOk ? c.changeRepeat : 0),
                   changeRestore = summarize(fig->changeRestoreMs, fig->changeOk ? c.changeRepeat : 0),
                   floorChange = summarize(fig->floorChangeMs, fig->changeOk ? c.changeRepeat : 0),
                   upstreamChange = summarize(fig->upstreamChangeMs, fig->changeOk ? c.changeRepeat : 0);
        auto ratio = [](const Stat& a, const Stat& b) {
          return a.median > 0 && b.median > 0 ? fmt::format("{:.2f}", a.median / b.median) : std::string("n/a");
        };
        std::printf("%-7s %-6d %-3d | %-22s %-22s %-22s %-22s %5s | %-19s %-19s %-19s %-22s %5s %5s | %7ld %7ld | %9s %9s %4s %7s\n",
                    v.c_str(), n, eps, show(full, 0).c_str(), show(fullRestore, 0).c_str(),
                    show(flushFloorFull, 0).c_str(), show(floorFull, 0).c_str(), ratio(full, flushFloorFull).c_str(), show(change, 1).c_str(), show(changeRestore, 1).c_str(),
                    show(floorChange, 1).c_str(), show(upstreamChange, 1).c_str(), ratio(change, floorChange).c_str(),
                    ratio(upstreamChange, change).c_str(), fig->rssMiB, fig->toolRssMiB,
                    fig->restartOk ? fmt::format("{:.0f}", fig->restartMs).c_str() : "n/a",
                    fig->restartOk ? fmt::format("{:.0f}", fig->restartSaveMs).c_str() : "n/a",
                    fig->restartOk ? std::to_string(fig->restartOps).c_str() : "n/a",
                    fig->restartOk ? std::to_string(fig->restartRssMiB).c_str() : "n/a");
        std::fprintf(stderr, "  base RSS %ld MiB; full input %lu bytes, %lu changes; change input %lu bytes, "
                     "%lu changes; upstream's %lu bytes; load %s\n",
                     fig->baseRssMiB, fig->fullBytes, fig->fullOps, fig->changeBytes, fig->changeOps,
                     fig->upstreamBytes, loadAverage().c_str());
        if (c.tools.variant == Variant::kLegacy) {
          const Stat replace = summarize(fig->kernelReplaceMs, fig->changeOk ? c.changeRepeat : 0);
          std::printf("%-7s %-6d %-3d | kernel replace of the unchanged nat table (any legacy writer's floor): %s ms; "
                      "change / replace %s, upstream's input / replace %s\n",
                      v.c_str(), n, eps, show(replace, 1).c_str(), ratio(change, replace).c_str(),
                      ratio(upstreamChange, replace).c_str());
        }
        if (c.netlinkFloor) {
          const Stat netlink = summarize(fig->netlinkMs, c.fullRepeat), netlinkSys = summarize(fig->netlinkSysMs, c.fullRepeat),
                     floorUser = summarize(fig->flushFloorUserMs, c.fullRepeat),
                     floorSys = summarize(fig->flushFloorSysMs, c.fullRepeat);
          std::printf("%-7s %-6d %-3d | floor flush CPU: user %s, system %s ms | netlink replay of the floor's tables: "
                      "%s ms (system CPU %s ms), %lu objects in %lu bytes, same save: %s; full / replay %s, "
                      "floor flush / replay %s\n",
                      v.c_str(), n, eps, show(floorUser, 0).c_str(), show(floorSys, 0).c_str(), show(netlink, 0).c_str(),
                      show(netlinkSys, 0).c_str(), fig->netlinkObjects,
                      fig->netlinkBytes, fig->netlinkSame == 1 ? "yes" : fig->netlinkSame == 0 ? "NO" : "not checked",
                      ratio(full, netlink).c_str(), ratio(flushFloorFull, netlink).c_str());
        }
        std::fflush(stdout);
      }
    }
  }
  std::printf("# load at end: %s\n", loadAverage().c_str());
  return 0;
}
