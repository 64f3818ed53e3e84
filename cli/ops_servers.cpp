#include "ops_servers.h"

#include <charconv>
#include <optional>
#include <string_view>

#include "health.h"
#include "healthcheck_nodeports.h"
#include "http_server.h"
#include "kproxy/core/log.h"
#include "metrics.h"
#include "net_util.h"

namespace kproxy::cli {
namespace {

constexpr auto kBindRetryInterval = std::chrono::seconds(5);

struct BindAddress {
  std::string host;
  std::uint16_t port = 0;
};

std::optional<BindAddress> parseBindAddress(const std::string& text) {
  auto hp = splitHostPort(text);
  if (!hp) return std::nullopt;
  unsigned port = 0;
  const auto [ptr, ec] = std::from_chars(hp->port.data(), hp->port.data() + hp->port.size(), port);
  if (ec != std::errc{} || ptr != hp->port.data() + hp->port.size() || port > 65535) return std::nullopt;
  if (!hp->host.empty() && !ipFamilyOf(hp->host)) return std::nullopt;
  return BindAddress{hp->host, static_cast<std::uint16_t>(port)};
}

// The value of `name` in the target's query string, percent-decoded ("" when absent).
std::string queryValue(const std::string& target, std::string_view name) {
  const auto q = target.find('?');
  if (q == std::string::npos) return {};
  std::string_view rest(target);
  rest.remove_prefix(q + 1);
  while (!rest.empty()) {
    const auto amp = rest.find('&');
    std::string_view item = rest.substr(0, amp);
    rest = amp == std::string_view::npos ? std::string_view{} : rest.substr(amp + 1);
    const auto eq = item.find('=');
    if (item.substr(0, eq) != name) continue;
    std::string out;
    if (eq == std::string_view::npos) return out;
    const std::string_view v = item.substr(eq + 1);
    for (std::size_t i = 0; i < v.size(); ++i) {
      unsigned hex = 0;
      if (v[i] == '%' && i + 2 < v.size() &&
          std::from_chars(v.data() + i + 1, v.data() + i + 3, hex, 16).ptr == v.data() + i + 3) {
        out += static_cast<char>(hex);
        i += 2;
      } else {
        out += v[i] == '+' ? ' ' : v[i];
      }
    }
    return out;
  }
  return {};
}

}  // namespace

struct OpsServers::Impl {
  Impl(OpsOptions o, const core::Proxier& p, core::Clock& c)
      : options(std::move(o)),
        proxier(p),
        clock(c),
        startWall(c.wallSeconds()),
        metrics(options.mode, startWall, options.families, options.build) {}

  OpsOptions options;
  const core::Proxier& proxier;
  core::Clock& clock;
  double startWall;
  ProxyMetrics metrics;
  EventLoop loop;
  std::unique_ptr<HttpServer> metricsServer;
  std::unique_ptr<HttpServer> healthServer;
  std::unique_ptr<ServiceHealthServers> serviceHealth;
  std::function<void(const std::string&)> onFatal;
  // Loop thread only: the snapshot the health-check ports were last reconciled against.
  std::shared_ptr<const core::Snapshot> reconciled;

  HealthInput healthInput() const {
    const core::ProxierStatus status = proxier.status();
    HealthInput in;
    in.nowWall = clock.wallSeconds();
    in.startWall = startWall;
    in.lastSuccessWall = status.lastSuccessWall;
    in.oldestQueuedWall = status.oldestQueuedWall;
    in.healthTimeout = options.healthTimeout;
    in.nodeDeleting = status.nodeDeleting;
    in.nodeSeen = status.nodeSeen;
    in.nodeRequired = options.nodeRequired;
    in.families = options.families;
    return in;
  }

  HttpResponse serveMetricsServer(const HttpRequest& req) {
    const std::string path = req.path();
    if (path == "/metrics") {
      HttpResponse r;
      r.contentType = "text/plain; version=0.0.4; charset=utf-8";
      r.body = metrics.render(proxier.status(), readProcessStats());
      if (options.extraMetrics) r.body += options.extraMetrics();
      return r;
    }
    if (path == "/proxyMode") {
      HttpResponse r;
      r.headers.emplace_back("X-Content-Type-Options", "nosniff");
      r.body = options.mode;
      return r;
    }
    if (path == "/healthz") return HttpResponse{200, "text/plain; charset=utf-8", {{"X-Content-Type-Options", "nosniff"}}, "ok"};
    if (path == "/debug/services" && options.debugServices) {
      HttpResponse r;
      r.contentType = "application/json";
      r.body = options.debugServices(queryValue(req.target, "service"));
      return r;
    }
    if (options.setVerbosity && (path == "/debug/flags" || path.starts_with("/debug/flags/"))) {
      return serveDebugFlags(req, path);
    }
    if (path == "/configz") {
      HttpResponse r;
      r.contentType = "application/json";
      r.body = options.configzJson;
      return r;
    }
    return notFound();
  }

  // Upstream's routes.DebugFlags with the one flag it installs, "v": PUT /debug/flags/v sets
  // the verbosity; any other method there is refused; every other /debug/flags path is the index.
  HttpResponse serveDebugFlags(const HttpRequest& req, const std::string& path) {
    const std::vector<std::pair<std::string, std::string>> nosniff = {{"X-Content-Type-Options", "nosniff"}};
    if (path == "/debug/flags/v") {
      if (req.method != "PUT") return HttpResponse{406, "text/plain", nosniff, "unsupported http method"};
      auto answer = options.setVerbosity(req.body);
      if (!answer) return HttpResponse{400, "text/plain", nosniff, answer.error()};
      log::info(0, "Log verbosity changed", {{"request", req.body}});
      return HttpResponse{200, "text/plain", nosniff, *answer};
    }
    return HttpResponse{200, "text/html; charset=utf-8", {},
                        "<html>\n<head>\n<title>/debug/flags/</title>\n</head>\n<body>\n/debug/flags/<br>\n<br>\n"
                        "flags:<br>\n<table>\n<tr>v<br>\n</table>\n<br>\nfull flags configurable<br>\n"
                        "</body>\n</html>\n"};
  }

  HttpResponse serveHealthServer(const HttpRequest& req) {
    const std::string path = req.path();
    if (path == "/healthz") {
      HttpResponse r = healthzResponse(healthInput());
      metrics.countHealthz(r.status);
      return r;
    }
    if (path == "/livez") {
      HttpResponse r = livezResponse(healthInput());
      metrics.countLivez(r.status);
      return r;
    }
    return notFound();
  }

  // Binds on the loop thread; on failure logs and retries every 5 s (or gives up fatally with
  // bindAddressHardFail), as upstream's serveHealthz/serveMetrics loops do.
  void bind(HttpServer& server, const std::string& what, const std::string& address) {
    auto parsed = parseBindAddress(address);
    if (!parsed) {
      log::error("Invalid bind address; server disabled", {{"server", what}, {"address", address}});
      return;
    }
    if (auto r = server.listen(parsed->host, parsed->port); !r) {
      log::error("Failed to start server; retrying", {{"server", what}, {"address", address},
                                                      {"error", r.error().message()},
                                                      {"retryIn", "5s"}});
      if (options.bindAddressHardFail) {
        if (onFatal) onFatal(what + " server failed: " + r.error().message());
        return;
      }
      loop.runAfter(kBindRetryInterval, [this, &server, what, address] { bind(server, what, address); });
      return;
    }
    log::info(0, "Serving", {{"server", what}, {"address", address}});
  }
};

OpsServers::OpsServers(OpsOptions options, const core::Proxier& proxier, core::Clock& clock)
    : impl_(std::make_unique<Impl>(std::move(options), proxier, clock)) {}

OpsServers::~OpsServers() { stop(); }

void OpsServers::start(std::function<void(const std::string&)> onFatal) {
  Impl& d = *impl_;
  d.onFatal = std::move(onFatal);
  if (!d.options.metricsBindAddress.empty()) {
    d.metricsServer = std::make_unique<HttpServer>(
        d.loop, "metrics", [&d](const HttpRequest& req) { return d.serveMetricsServer(req); });
    if (d.options.setVerbosity) d.metricsServer->allowPut("/debug/flags/v");
  }
  if (!d.options.healthzBindAddress.empty()) {
    d.healthServer = std::make_unique<HttpServer>(
        d.loop, "healthz", [&d](const HttpRequest& req) { return d.serveHealthServer(req); });
  }
  d.serviceHealth = std::make_unique<ServiceHealthServers>(
      d.loop, [&d] { return evaluateProxyHealth(d.healthInput()).healthy; },
      d.options.healthCheckAddresses);
  d.loop.post([&d] {
    if (d.metricsServer) d.bind(*d.metricsServer, "metrics", d.options.metricsBindAddress);
    if (d.healthServer) d.bind(*d.healthServer, "healthz", d.options.healthzBindAddress);
  });
  d.loop.start();
}

void OpsServers::stop() {
  Impl& d = *impl_;
  d.loop.stop();
  // With the loop stopped nothing runs concurrently with these destructors.
  d.serviceHealth.reset();
  d.metricsServer.reset();
  d.healthServer.reset();
}

void OpsServers::observe(const core::SyncObservation& observation) {
  Impl& d = *impl_;
  d.metrics.observeSync(observation);
  std::shared_ptr<const core::Snapshot> applied = d.proxier.status().applied;
  if (!applied) return;
  d.loop.post([&d, applied = std::move(applied)] {
    // Failed and no-op syncs leave the applied snapshot as it was: nothing to reconcile.
    if (!d.serviceHealth || applied == d.reconciled) return;
    d.reconciled = applied;
    d.serviceHealth->reconcile(*applied);
  });
}

}  // namespace kproxy::cli
