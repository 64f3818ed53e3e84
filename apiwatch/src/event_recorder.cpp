#include "kproxy/apiwatch/event_recorder.h"

#include <atomic>
#include <chrono>
#include <ctime>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "http_client.h"
#include "kproxy/core/log.h"

namespace kproxy::apiwatch {
namespace {

using namespace detail;
constexpr auto kTimeout = std::chrono::seconds(10);
constexpr std::uint64_t kMaxBody = 1 << 20;

std::string rfc3339(double wall) {
  const std::time_t t = static_cast<std::time_t>(wall);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

double nowWall() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

struct EventRecorder::Impl {
  ClientConfig config;
  std::string node;
  std::shared_ptr<asio::ssl::context> tls;
  asio::io_context io{1};
  asio::executor_work_guard<asio::io_context::executor_type> work = asio::make_work_guard(io);
  std::thread thread;
  std::atomic<std::uint64_t> posted{0};
  std::atomic<std::uint64_t> failed{0};

  // One request on a fresh connection (events are rare): the body, or an exception.
  Task<http::response<http::string_body>> call(http::verb verb, const std::string& target, std::string body) {
    // Reported as client-go reports its requests (rest_client_*); Events are not rate limited.
    struct Metrics {
      const ClientConfig& config;
      http::verb verb;
      std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();
      std::string code{kRequestErrorCode};
      ~Metrics() {
        if (!config.requestMetrics) return;
        const std::string host = metricsHost(config.server);
        const std::string method(http::to_string(verb));
        config.requestMetrics->requestDone(method, host, code);
        config.requestMetrics->requestLatency(
            method, host, std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
      }
    } metrics{config, verb};
    auto connection = co_await Connection::open(config, tls.get(), kTimeout);
    auto base = makeGet(config, target);
    http::request<http::string_body> request{verb, base.target(), 11};
    for (const auto& field : base) request.set(field.name_string(), field.value());
    if (!body.empty()) {
      request.set(http::field::content_type, "application/json");
      request.body() = std::move(body);
      request.prepare_payload();
    }
    connection->expiresAfter(kTimeout);
    co_await connection->write(request);
    auto response = co_await connection->readResponse(kMaxBody);
    connection->close();
    metrics.code = std::to_string(response.result_int());
    co_return response;
  }

  Task<void> send(ServiceEvent e) {
    const std::string what = fmt::format("event {} on Service {}/{}", e.reason, e.ns, e.service);
    try {
      // kubectl describe selects a Service's events by its UID.
      auto svc = co_await call(http::verb::get,
                               fmt::format("/api/v1/namespaces/{}/services/{}", e.ns, e.service), {});
      if (svc.result_int() != 200) {
        ++failed;
        log::warning("not posting an event: the Service cannot be read",
                     {{"event", what}, {"status", std::to_string(svc.result_int())}});
        co_return;
      }
      const auto service = nlohmann::json::parse(svc.body(), nullptr, false);
      const std::string uid =
          service.is_object() ? service.value("/metadata/uid"_json_pointer, std::string()) : std::string();
      const double now = nowWall();
      const std::string first = rfc3339(e.firstSeenWall > 0 ? e.firstSeenWall : now);
      nlohmann::json event = {
          {"apiVersion", "v1"},
          {"kind", "Event"},
          {"metadata", {{"generateName", e.service + "."}, {"namespace", e.ns}}},
          {"involvedObject",
           {{"apiVersion", "v1"}, {"kind", "Service"}, {"namespace", e.ns}, {"name", e.service}, {"uid", uid}}},
          {"reason", e.reason},
          {"message", e.message},
          {"type", e.type},
          {"source", {{"component", "kproxy"}, {"host", node}}},
          {"reportingComponent", "kproxy"},
          {"reportingInstance", node},
          {"firstTimestamp", first},
          {"lastTimestamp", rfc3339(now)},
          {"count", e.count}};
      auto r = co_await call(http::verb::post, fmt::format("/api/v1/namespaces/{}/events", e.ns), event.dump());
      if (r.result_int() >= 300) {
        ++failed;
        log::warning("the API server refused an event",
                     {{"event", what}, {"status", std::to_string(r.result_int())}, {"body", r.body().substr(0, 300)}});
        co_return;
      }
      ++posted;
      log::info(1, "posted an event", {{"event", what}});
    } catch (const std::exception& ex) {
      ++failed;
      log::warning("an event could not be posted", {{"event", what}, {"error", ex.what()}});
    }
  }
};

EventRecorder::EventRecorder() : impl_(std::make_unique<Impl>()) {}

core::Result<std::unique_ptr<EventRecorder>> EventRecorder::create(ClientConfig config, std::string node) {
  std::unique_ptr<EventRecorder> r(new EventRecorder());
  r->impl_->config = std::move(config);
  r->impl_->node = std::move(node);
  if (r->impl_->config.server.tls) {
    auto tls = makeTlsContext(r->impl_->config);
    if (!tls) return std::unexpected(tls.error());
    r->impl_->tls = std::move(*tls);
  }
  r->impl_->thread = std::thread([impl = r->impl_.get()] { impl->io.run(); });
  return r;
}

EventRecorder::~EventRecorder() {
  impl_->work.reset();
  // Events in flight get a moment; the connection timeouts bound the rest.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  while (!impl_->io.stopped() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  impl_->io.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

void EventRecorder::post(ServiceEvent event) {
  asio::co_spawn(impl_->io, impl_->send(std::move(event)), asio::detached);
}

std::uint64_t EventRecorder::posted() const { return impl_->posted; }
std::uint64_t EventRecorder::failed() const { return impl_->failed; }

}  // namespace kproxy::apiwatch
