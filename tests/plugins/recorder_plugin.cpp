// A real backend plugin built only with the public SDK: it programs nothing and instead appends
// the options it was created with and what each sync received to the file named by option
// "record-file". It proves the ABI end to end (loader, snapshot accessors, changed keys,
// options, errors, metrics) before any kernel backend.
//
// Also built against the frozen ABI 1.1 headers (tests/plugins/abi_1_1, as "old-recorder"):
// what came with ABI 1.2 is compiled only when the header says so (KPROXY_PLUGIN_ABI_MINOR).
#include <cstdlib>
#include <fstream>
#include <string>

#include "kproxy/plugin/sdk.h"

namespace {

using namespace kproxy::sdk;

std::string familyName(Family f) { return f == Family::kIPv4 ? "v4" : "v6"; }

std::string describe(const ServicePort& p) {
  std::string out = familyName(p.family) + ":" + p.key + " " + protocolName(p.protocol) + " " +
                    p.clusterIP + ":" + std::to_string(p.port);
  if (p.nodePort != 0) out += " nodePort=" + std::to_string(p.nodePort);
  if (p.sessionAffinityClientIP) out += " affinity=" + std::to_string(p.stickyMaxAgeSeconds);
  out += " endpoints=";
  for (std::size_t i = 0; i < p.clusterEndpoints.size(); ++i) {
    if (i) out += ",";
    out += p.clusterEndpoints[i].ip + ":" + std::to_string(p.clusterEndpoints[i].port);
  }
  return out;
}

#if defined(KPROXY_PLUGIN_ABI_MINOR) && KPROXY_PLUGIN_ABI_MINOR >= 2
#define RECORDER_ABI_1_2 1
#endif

class RecorderBackend final : public BackendPlugin {
 public:
  RecorderBackend(Host host, std::string file, std::string failSyncs)
      : host_(host), file_(std::move(file)), failSyncs_(std::move(failSyncs)) {}

  Expected<SyncOutcome> sync(const SyncContext& ctx) override {
    if (!failSyncs_.empty()) {
#ifdef RECORDER_ABI_1_2
      // fail-sync=kernel|invalid|transient: a failure of that category (true: none said).
      ErrorCategory category = failSyncs_ == "kernel"      ? ErrorCategory::kKernelRefused
                               : failSyncs_ == "invalid"   ? ErrorCategory::kInvalidInput
                               : failSyncs_ == "transient" ? ErrorCategory::kTransient
                                                           : ErrorCategory::kUnknown;
      return fail(category, "recorder: refusing sync as asked (option fail-sync)", 5);
#else
      return fail("recorder: refusing sync as asked (option fail-sync)", 5);
#endif
    }
    // KPROXY_RECORDER_FAIL_SERVICE=NAME: every sync of a snapshot holding Service NAME fails
    // (a kernel that keeps refusing one service's rules).
    if (const char* poison = std::getenv("KPROXY_RECORDER_FAIL_SERVICE"); poison != nullptr && *poison) {
      bool holds = false;
      ctx.next.forEach([&](const ServicePort& p) { holds = holds || p.serviceName == poison; });
      if (holds) return fail(std::string("recorder: refusing the rules of Service ") + poison + " as asked", 22);
    }
#ifdef RECORDER_ABI_1_2
    syncs_.add({ctx.full ? "full" : "partial"}, 1);
#endif
    std::ofstream out(file_, std::ios::app);
    if (!out) return fail("recorder: cannot open " + file_, 2);
    out << "sync full=" << ctx.full << " previous=" << ctx.previous.valid()
        << " size=" << ctx.next.size() << " node=" << ctx.next.node().name << "\n";
#ifdef RECORDER_ABI_1_2
    if (const auto np = ctx.next.node().nodePortAddresses; np.resolved) {
      out << "nodeports all4=" << np.allLocalIPv4 << " all6=" << np.allLocalIPv6 << " addresses=";
      for (std::size_t i = 0; i < np.addresses.size(); ++i) out << (i ? "," : "") << np.addresses[i];
      out << "\n";
    }
#endif
    for (const auto& key : ctx.changed) {
      auto port = ctx.next.find(key.family, key.key);
      out << "changed " << familyName(key.family) << ":" << key.key << " "
          << (port ? describe(*port) : std::string("deleted")) << "\n";
    }
    for (const auto& port : ctx.next.all()) out << "state " << describe(port) << "\n";
    host_.info(2, "recorder synced");
    return SyncOutcome{ctx.changed.size(), "recorded " + std::to_string(ctx.changed.size())};
  }

#ifndef RECORDER_WITHOUT_EXPLAIN
  // Echoes the request and what the snapshot holds, so a test sees every field cross the ABI.
  Expected<std::string> explain(const SnapshotView& snapshot, const ExplainRequest& r) override {
    if (r.destinationPort == 0) return fail("recorder: destination port 0", 22);
    std::string out = std::string(r.json ? "json " : "text ") + familyName(r.family) + " " +
                      r.sourceIP + " -> " + r.destinationIP + ":" +
                      std::to_string(r.destinationPort) + "/" + protocolName(r.protocol) +
                      " fromNode=" + (r.fromNode ? "1" : "0") + " iif=" + r.inputInterface +
                      " node=" + snapshot.node().name + "\n";
    for (const auto& port : snapshot.all()) out += "port " + describe(port) + "\n";
    return out;
  }
#endif

#ifdef RECORDER_ABI_1_2
  void countSyncs(Metric syncs) { syncs_ = syncs; }
#endif

  Expected<void> cleanup() override {
    std::ofstream out(file_, std::ios::app);
    out << "cleanup\n";
    return {};
  }

 private:
  Host host_;
  std::string file_;
  std::string failSyncs_;
#ifdef RECORDER_ABI_1_2
  Metric syncs_;
#endif
};

Expected<std::unique_ptr<BackendPlugin>> makeRecorder(const Host& host, const Options& options) {
  // Through the kproxy program (which passes only its own options) the file comes from the
  // environment.
  std::string file;
  if (auto it = options.find("record-file"); it != options.end()) file = it->second;
  if (file.empty()) {
    const char* env = std::getenv("KPROXY_RECORD_FILE");
    if (env != nullptr) file = env;
  }
  if (file.empty()) return fail("recorder: option record-file is required");
  std::string failSyncs;
  if (auto it = options.find("fail-sync"); it != options.end() && it->second != "false")
    failSyncs = it->second;
  {
    std::ofstream out(file, std::ios::app);
    for (const auto& [key, value] : options) out << "option " << key << "=" << value << "\n";
  }
  auto backend = std::make_unique<RecorderBackend>(host, file, failSyncs);
#ifdef RECORDER_ABI_1_2
  // Option metric-name: another name for the sync counter (tests of refused names).
  std::string name = "recorder_syncs_total";
  if (auto it = options.find("metric-name"); it != options.end()) name = it->second;
  auto syncs = host.counter(name, "Syncs the recorder recorded", {"kind"});
  if (!syncs) return std::unexpected(syncs.error());
  backend->countSyncs(*syncs);
#endif
  return backend;
}

}  // namespace

#if defined(RECORDER_WITHOUT_EXPLAIN)
KPROXY_DEFINE_PLUGIN("plain", "1.0", "the recorder without explain (tests)", makeRecorder)
#elif !defined(RECORDER_ABI_1_2)
KPROXY_DEFINE_PLUGIN("old-recorder", "1.1", "the recorder built against ABI 1.1 (tests)", makeRecorder)
#else
KPROXY_DEFINE_PLUGIN("recorder", "1.0", "records what it is asked to program (tests)", makeRecorder)
#endif
