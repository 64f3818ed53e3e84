// kproxy-probe-nftables-ops: what one small netlink batch costs the kernel, by kind of op, in a
// table that already holds kproxy's ruleset for N services. Answers "which changes make the
// kernel re-validate the whole table at commit": nf_tables marks a table for validation when a
// batch adds a rule with any expression that has a ->validate op (immediate, nat, lookup,
// masq, reject, meta set, ...) or a map element whose verdict is a jump/goto, and then walks
// every base chain and everything reachable from it (through jumps and verdict maps).
//
//   kproxy-probe-nftables-ops [--services 1000,10000,30000] [--endpoints 2] [--repeat 7]
//
// Needs root; each size runs in a forked child in its own network namespace.

#include <sched.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "../../tests/unit/nftables/service_ports.h"
#include "bench_args.h"
#include "kproxy/nftables/backend.h"
#include "kproxy/nftables/renderer.h"

using namespace kproxy;
using namespace kproxy::nftables;

namespace {

using Clock = std::chrono::steady_clock;


Op makeOp(OpKind kind, std::string name) {
  Op o;
  o.kind = kind;
  o.family = net::Family::kIPv4;
  o.name = std::move(name);
  return o;
}
Op addRule(const std::string& chain, std::vector<Statement> statements) {
  Op o = makeOp(OpKind::kAddRule, chain);
  o.rule = Rule{std::move(statements)};
  o.ruleHash = ruleHash(net::Family::kIPv4, chain, o.rule);
  return o;
}
Op element(OpKind kind, const Element& e, bool withValue) {
  Op o = makeOp(kind, e.set);
  Element copy = e;
  if (!withValue) copy.value.reset();
  o.element = std::make_shared<const Element>(std::move(copy));
  return o;
}

double threadCpuMs() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
}

struct Timing {
  double wallMs = -1;
  double cpuMs = -1;  ///< CPU time of this thread (the kernel runs the batch in our context)
};

/// Median wall and CPU time of `timed` over `repeat` rounds; `undo` (untimed) restores the
/// table. CPU time is the figure to trust on a loaded machine: it excludes waiting for a core.
Timing median(KernelNftables& k, int repeat, const std::vector<Op>& timed,
              const std::vector<Op>& undo, bool& ok) {
  std::vector<double> ms;
  std::vector<double> cpu;
  for (int i = 0; i < repeat; ++i) {
    auto t = Clock::now();
    double c = threadCpuMs();
    auto r = k.apply(timed);
    cpu.push_back(threadCpuMs() - c);
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t).count());
    if (!r) {
      std::fprintf(stderr, "probe batch refused: %s\n", r.error().message().c_str());
      ok = false;
      return {};
    }
    if (!undo.empty() && !k.apply(undo)) {
      std::fprintf(stderr, "probe undo refused\n");
      ok = false;
      return {};
    }
  }
  std::sort(ms.begin(), ms.end());
  std::sort(cpu.begin(), cpu.end());
  return {ms[ms.size() / 2], cpu[cpu.size() / 2]};
}

int probe(int n, int eps, int repeat) {
  auto ports = testing::manyServices(n, eps);
  VectorSnapshot snap(ports);
  NftablesBackend backend(sdk::Host(nullptr), BackendSettings{}, makeNetlinkKernel());
  auto full = backend.syncFrom(snap, {}, true);
  if (!full) {
    std::fprintf(stderr, "full sync failed: %s\n", full.error().message.c_str());
    return 1;
  }
  auto kernel = makeNetlinkKernel();
  NftablesRenderer renderer(RenderConfig{});
  // A port without affinity (every tenth has it) in the middle of the table.
  const auto& port = ports[static_cast<std::size_t>(n / 2 + 1)];
  Fragment frag = renderer.renderServicePort(port);
  const Element* svcElem = nullptr;
  for (const auto& e : frag.elements)
    if (e.set == names::kServiceIPsMap) svcElem = &e;
  const Chain* svcChain = nullptr;
  for (const auto& c : frag.chains)
    if (c.name.starts_with("service-")) svcChain = &c;
  if (svcElem == nullptr || svcChain == nullptr) return 1;
  Element dropElem{names::kNoEndpointServicesMap, svcElem->key, svcElem->keyText,
                   Verdict{VerdictKind::kDrop, {}}};
  Element gotoElem{names::kNoEndpointServicesMap, svcElem->key, svcElem->keyText,
                   Verdict{VerdictKind::kGoto, names::kRejectChain}};
  const std::string probeChain = "probe-unreferenced";
  if (!kernel->apply({makeOp(OpKind::kAddChain, probeChain)})) return 1;

  struct Case {
    const char* name;
    std::vector<Op> timed;
    std::vector<Op> undo;
  };
  std::vector<Op> svcRefill;
  svcRefill.push_back(makeOp(OpKind::kFlushChain, svcChain->name));
  for (const auto& r : svcChain->rules) {
    Op o = makeOp(OpKind::kAddRule, svcChain->name);
    o.rule = r;
    o.ruleHash = ruleHash(net::Family::kIPv4, svcChain->name, r);
    svcRefill.push_back(std::move(o));
  }
  const Op flushProbe = makeOp(OpKind::kFlushChain, probeChain);
  std::vector<Case> cases = {
      {"empty batch (add existing table)", {makeOp(OpKind::kAddTable, "")}, {}},
      {"add chain (empty, unreferenced)", {makeOp(OpKind::kAddChain, "probe-new")},
       {makeOp(OpKind::kDeleteChain, "probe-new")}},
      {"delete chain (empty, unreferenced)", {makeOp(OpKind::kDeleteChain, "probe-new")},
       {makeOp(OpKind::kAddChain, "probe-new")}},
      {"delete element service-ips (goto)", {element(OpKind::kDeleteElement, *svcElem, false)},
       {element(OpKind::kAddElement, *svcElem, true)}},
      {"add element service-ips (goto)", {element(OpKind::kAddElement, *svcElem, true)},
       {element(OpKind::kDeleteElement, *svcElem, false)}},
      {"add element vmap (drop)", {element(OpKind::kAddElement, dropElem, true)},
       {element(OpKind::kDeleteElement, dropElem, false)}},
      {"add element vmap (goto reject-chain)", {element(OpKind::kAddElement, gotoElem, true)},
       {element(OpKind::kDeleteElement, gotoElem, false)}},
      {"add rule: numgen match, no verdict", {addRule(probeChain, {MatchNumgen{2}})}, {flushProbe}},
      {"add rule: ip saddr match, no verdict",
       {addRule(probeChain, {MatchAddress{true, false, *net::Prefix::parse("10.1.2.3")}})},
       {flushProbe}},
      {"add rule: accept (immediate verdict)",
       {addRule(probeChain, {Verdict{VerdictKind::kAccept, {}}})}, {flushProbe}},
      {"add rule: goto a service chain",
       {addRule(probeChain, {Verdict{VerdictKind::kGoto, svcChain->name}})}, {flushProbe}},
      {"add rule: dnat (immediate + nat)",
       {addRule(probeChain, {MatchL4Proto{6}, DnatTo{*net::Prefix::parse("10.1.2.3"), 80}})},
       {flushProbe}},
      {"flush chain (delete rules)", {flushProbe},
       {addRule(probeChain, {Verdict{VerdictKind::kGoto, svcChain->name}})}},
      {"refill a service chain (flush + rules)", svcRefill, {}},
  };
  // "flush" needs something to flush first.
  if (!kernel->apply({makeOp(OpKind::kAddChain, "probe-new")})) return 1;
  if (!kernel->apply({makeOp(OpKind::kDeleteChain, "probe-new")})) return 1;
  for (auto& c : cases) {
    bool ok = true;
    if (std::string(c.name).starts_with("delete chain")) (void)kernel->apply({makeOp(OpKind::kAddChain, "probe-new")});
    if (std::string(c.name).starts_with("flush chain"))
      (void)kernel->apply({addRule(probeChain, {Verdict{VerdictKind::kGoto, svcChain->name}})});
    Timing t = median(*kernel, repeat, c.timed, c.undo, ok);
    if (std::string(c.name).starts_with("delete chain")) (void)kernel->apply(c.undo);
    std::printf("%-8d %-4d | %-42s | %9.2f | %9.2f%s\n", n, eps, c.name, t.wallMs, t.cpuMs,
                ok ? "" : " (refused)");
  }
  // Where the validation walk goes: the same validating batch after cutting the walk's roots.
  // nat-output and nat-prerouting both reach `services` (and through service-ips every
  // service and endpoint chain); the filter base chains reach only the small check chains.
  const std::vector<Op> validating = {addRule(probeChain, {Verdict{VerdictKind::kAccept, {}}})};
  for (const char* root : {"nat-output", "nat-prerouting"}) {
    if (!kernel->apply({makeOp(OpKind::kFlushChain, root)})) return 1;
    bool ok = true;
    Timing t = median(*kernel, repeat, validating, {flushProbe}, ok);
    std::printf("%-8d %-4d | %-42s | %9.2f | %9.2f%s\n", n, eps,
                (std::string("add rule: accept, after flushing ") + root).c_str(), t.wallMs,
                t.cpuMs, ok ? "" : " (refused)");
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> sizes{1000, 10000};
  std::vector<int> endpoints{2};
  int repeat = 7;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--services" && i + 1 < argc) sizes = kproxy::bench::parseList(argv[++i]);
    else if (a == "--endpoints" && i + 1 < argc) endpoints = kproxy::bench::parseList(argv[++i]);
    else if (a == "--repeat" && i + 1 < argc) repeat = std::max(1, std::atoi(argv[++i]));
    else {
      std::fprintf(stderr, "usage: %s [--services 1000,10000] [--endpoints 2] [--repeat 7]\n", argv[0]);
      return 2;
    }
  }
  if (geteuid() != 0) {
    std::fprintf(stderr, "kproxy-probe-nftables-ops needs root (it creates network namespaces)\n");
    return 1;
  }
  std::printf("%-8s %-4s | %-42s | %9s | %9s\n", "services", "eps", "batch", "wall_ms",
              "cpu_ms");
  int failures = 0;
  for (int n : sizes) {
    for (int eps : endpoints) {
      std::fflush(stdout);
      pid_t pid = fork();
      if (pid < 0) return 1;
      if (pid == 0) {
        if (unshare(CLONE_NEWNET) != 0) {
          std::perror("unshare(CLONE_NEWNET)");
          _exit(2);
        }
        int rc = probe(n, eps, repeat);
        std::fflush(stdout);
        _exit(rc);
      }
      int status = 0;
      waitpid(pid, &status, 0);
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failures;
    }
  }
  return failures == 0 ? 0 : 1;
}
