// A complete third-party backend: it programs nothing and logs, through the host, one line per
// service port that changed. Build it against an installed kproxy (see CMakeLists.txt).
#include <string>

#include <kproxy/plugin/sdk.h>

namespace {

class LogOnlyBackend final : public kproxy::sdk::BackendPlugin {
 public:
  explicit LogOnlyBackend(kproxy::sdk::Host host) : host_(host) {}

  kproxy::sdk::Expected<kproxy::sdk::SyncOutcome> sync(
      const kproxy::sdk::SyncContext& ctx) override {
    for (const auto& key : ctx.changed) {
      auto port = ctx.next.find(key.family, key.key);
      std::string what = port ? port->clusterIP + ":" + std::to_string(port->port) + " with " +
                                    std::to_string(port->clusterEndpoints.size()) + " endpoints"
                              : std::string("removed");
      host_.info(0, "logonly: " + key.key + " " + what);
    }
    return kproxy::sdk::SyncOutcome{0, "logged " + std::to_string(ctx.changed.size())};
  }
  kproxy::sdk::Expected<void> cleanup() override { return {}; }

 private:
  kproxy::sdk::Host host_;
};

kproxy::sdk::Expected<std::unique_ptr<kproxy::sdk::BackendPlugin>> makeLogOnly(
    const kproxy::sdk::Host& host, const kproxy::sdk::Options&) {
  return std::make_unique<LogOnlyBackend>(host);
}

}  // namespace

KPROXY_DEFINE_PLUGIN("logonly", "1.0", "logs what it would program", makeLogOnly)
