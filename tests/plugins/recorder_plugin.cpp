// A real backend plugin built only with the public SDK: it programs nothing and instead appends
// what each sync received to the file named by option "record-file". It proves the ABI end to
// end (loader, snapshot accessors, changed keys, options, errors) before any kernel backend.
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

class RecorderBackend final : public BackendPlugin {
 public:
  RecorderBackend(Host host, std::string file, bool failSyncs)
      : host_(host), file_(std::move(file)), failSyncs_(failSyncs) {}

  Expected<SyncOutcome> sync(const SyncContext& ctx) override {
    if (failSyncs_) return fail("recorder: refusing sync as asked (option fail-sync)", 5);
    std::ofstream out(file_, std::ios::app);
    if (!out) return fail("recorder: cannot open " + file_, 2);
    out << "sync full=" << ctx.full << " previous=" << ctx.previous.valid()
        << " size=" << ctx.next.size() << " node=" << ctx.next.node().name << "\n";
    if (const auto np = ctx.next.node().nodePortAddresses; np.resolved) {
      out << "nodeports all4=" << np.allLocalIPv4 << " all6=" << np.allLocalIPv6 << " addresses=";
      for (std::size_t i = 0; i < np.addresses.size(); ++i) out << (i ? "," : "") << np.addresses[i];
      out << "\n";
    }
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

  Expected<void> cleanup() override {
    std::ofstream out(file_, std::ios::app);
    out << "cleanup\n";
    return {};
  }

 private:
  Host host_;
  std::string file_;
  bool failSyncs_;
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
  bool failSyncs = options.contains("fail-sync") && options.at("fail-sync") == "true";
  return std::make_unique<RecorderBackend>(host, file, failSyncs);
}

}  // namespace

#ifdef RECORDER_WITHOUT_EXPLAIN
KPROXY_DEFINE_PLUGIN("plain", "1.0", "the recorder without explain (tests)", makeRecorder)
#else
KPROXY_DEFINE_PLUGIN("recorder", "1.0", "records what it is asked to program (tests)", makeRecorder)
#endif
