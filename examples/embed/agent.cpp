// A small node agent that embeds kproxy's core and API watcher as libraries, programs nothing,
// and prints what changed on this node at each sync: a service port added (+), changed (~) or
// removed (-), with the endpoints it resolves to here. It shows the three pieces an embedder
// wires together:
//   - a source of API objects (here the manifest directory; apiwatch::ApiSource reads an API
//     server the same way) feeding a core::Proxier, which is a core::EventSink;
//   - a core::Backend, through which the Proxier hands over each new immutable snapshot
//     together with the previous one and the keys that differ;
//   - a log::LogSink, so the core's and the watcher's log lines go where the agent's own do.
//
// Usage: kproxy-embed-agent MANIFEST_DIR NODE_NAME [SYNCS]
// Exits 0 after SYNCS syncs (default: runs until SIGINT/SIGTERM), 1 on an error.
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <kproxy/apiwatch/manifest_source.h>
#include <kproxy/core/backend.h>
#include <kproxy/core/log.h>
#include <kproxy/core/proxier.h>

namespace {

namespace core = kproxy::core;
namespace klog = kproxy::log;

std::mutex outputMutex;  // the agent's lines and its log lines come from several threads

// The agent's own log format: "agent-log LEVEL message {key=value ...}" on stdout. A real
// agent would hand the record to journald or its logging library instead.
class AgentLogSink final : public klog::LogSink {
 public:
  void write(const klog::Record& record) override {
    const char* level = record.severity == klog::Severity::kError     ? "error"
                        : record.severity == klog::Severity::kWarning ? "warning"
                                                                      : "info";
    std::string line = std::string("agent-log ") + level + " " + std::string(record.message) + " {";
    for (std::size_t i = 0; i < record.fields.size(); ++i) {
      line += (i ? " " : "") + std::string(record.fields[i].first) + "=" + record.fields[i].second;
    }
    std::lock_guard lock(outputMutex);
    std::cout << line << "}\n" << std::flush;
  }
};

std::string describe(const core::ServicePortState& port) {
  std::string out =
      std::string(toString(port.protocol)) + " " + port.clusterIP + ":" + std::to_string(port.port);
  if (port.nodePort != 0) out += " nodePort=" + std::to_string(port.nodePort);
  out += " endpoints=";
  const std::vector<core::Endpoint> endpoints = port.clusterEndpoints;
  if (endpoints.empty()) out += "none";
  for (std::size_t i = 0; i < endpoints.size(); ++i) out += (i ? "," : "") + endpoints[i].str();
  return out;
}

// Receives every snapshot the core publishes and prints the difference from the previous one.
// The core calls it from its sync thread only (core::Backend is not thread-safe).
class ChangePrinter final : public core::Backend {
 public:
  explicit ChangePrinter(int exitAfter) : exitAfter_(exitAfter) {}
  std::string_view name() const override { return "embed-printer"; }

  core::Result<core::SyncResult> sync(const core::SyncRequest& request) override {
    std::string out = "sync " + std::to_string(++syncs_) +
                      " generation=" + std::to_string(request.next->generation()) +
                      " kind=" + (request.kind == core::SyncKind::kFull ? "full" : "partial") +
                      " changed=" + std::to_string(request.changed.size()) + "\n";
    for (const auto& key : request.changed) {
      auto before = request.previous ? request.previous->find(key) : nullptr;
      auto after = request.next->find(key);
      const char* mark = !after ? "-" : before ? "~" : "+";
      out += std::string("  ") + mark + " " + key.name + " " + toString(key.family);
      if (after) out += " " + describe(*after);
      out += "\n";
    }
    {
      std::lock_guard lock(outputMutex);
      std::cout << out << std::flush;
    }
    if (exitAfter_ > 0 && syncs_ >= exitAfter_) done_ = true;
    return core::SyncResult{request.changed.size(),
                            "printed " + std::to_string(request.changed.size())};
  }
  core::Result<void> cleanup() override { return {}; }
  bool done() const { return done_; }

 private:
  int exitAfter_;
  int syncs_ = 0;
  std::atomic<bool> done_{false};
};

std::atomic<bool> stopRequested{false};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3 || argc > 4) {
    std::cerr << "usage: " << argv[0] << " MANIFEST_DIR NODE_NAME [SYNCS]\n";
    return 2;
  }
  const int exitAfter = argc == 4 ? std::atoi(argv[3]) : 0;

  // Route the core's logging before anything logs; -v2 shows a line per sync.
  klog::setLogSink(std::make_shared<AgentLogSink>());
  klog::setVerbosity(2);

  ChangePrinter printer(exitAfter);
  core::TrackerConfig tracker;
  tracker.nodeName = argv[2];
  core::ProxierOptions options;
  options.minSyncPeriod = std::chrono::milliseconds(200);
  core::Proxier proxier(tracker, printer, options);

  kproxy::apiwatch::ManifestSource source(argv[1], proxier);
  if (auto started = source.start(); !started) {
    std::cerr << "kproxy-embed-agent: " << started.error().message() << "\n";
    return 1;
  }

  std::signal(SIGINT, [](int) { stopRequested = true; });
  std::signal(SIGTERM, [](int) { stopRequested = true; });
  std::jthread syncLoop([&proxier](std::stop_token stop) { proxier.run(stop); });
  while (!stopRequested && !printer.done())
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  syncLoop.request_stop();
  syncLoop.join();
  source.stop();
  klog::setLogSink(nullptr);
  return 0;
}
