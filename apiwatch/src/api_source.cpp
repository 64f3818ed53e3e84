#include "kproxy/apiwatch/api_source.h"

#include <malloc.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string_view>
#include <thread>
#include <utility>
#include <variant>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "http_client.h"
#include "watch_stream.h"
#include "kproxy/apiwatch/decode.h"
#include "kproxy/core/log.h"

namespace kproxy::apiwatch {
namespace {

using detail::Connection;
using detail::Task;
using detail::WatchLineSplitter;
namespace asio = detail::asio;
namespace http = detail::http;
using nlohmann::json;
using SteadyClock = std::chrono::steady_clock;

// A LIST page of 500 Services is a few MB; this only guards against a runaway answer.
constexpr std::uint64_t kMaxListBody = 1ull << 30;
constexpr std::uint64_t kMaxErrorBody = 1ull << 20;
// One watch event (one object) larger than this is a broken stream, not an object.
constexpr std::size_t kMaxEventLine = 64u << 20;
// A LIST whose pages add up to this many bytes leaves that much freed heap behind (the
// bodies, their parsed documents): past it, the freed pages go back to the system. At 4 MiB a
// 1,000 × 10 cluster's lists stayed below it, and the first sync's peak sat on top of their
// garbage: 41 MiB against 33 with 1 MiB (BENCHMARKS.md).
constexpr std::uint64_t kTrimAfterListBytes = 1u << 20;

/// Decoded objects are immutable: what a resource holds is shared with the sink, not copied.
/// Each is allocated as its own kind (a variant of the kinds would size every EndpointSlice
/// like a Service), and is never null.
using SharedObject =
    std::variant<std::shared_ptr<const core::Service>, std::shared_ptr<const core::EndpointSlice>,
                 std::shared_ptr<const core::Node>, std::shared_ptr<const core::ServiceCIDR>>;
using Key = std::pair<std::string, std::string>;  // namespace (empty for Node), name
/// A key that borrows its strings (from an object or a Key).
using KeyView = std::pair<std::string_view, std::string_view>;

template <typename T>
std::string_view nsOf(const T& o) {
  if constexpr (requires { o.ns; }) {
    return o.ns;
  } else {
    return {};
  }
}

KeyView keyOf(const SharedObject& object) {
  return std::visit([](const auto& o) { return KeyView{nsOf(*o), o->name}; }, object);
}

KeyView view(const Key& key) { return {key.first, key.second}; }

/// Same kind and equal content (the same allocation, most often).
bool sameObject(const SharedObject& a, const SharedObject& b) {
  if (a.index() != b.index()) return false;
  return std::visit(
      [&b](const auto& x) {
        const auto& y = std::get<std::decay_t<decltype(x)>>(b);
        return x == y || *x == *y;
      },
      a);
}

/// Orders objects by namespace and name, read from the objects themselves: an index of them
/// needs no copy of their keys.
struct ByKey {
  using is_transparent = void;
  bool operator()(const SharedObject& a, const SharedObject& b) const { return keyOf(a) < keyOf(b); }
  bool operator()(const SharedObject& a, const KeyView& b) const { return keyOf(a) < b; }
  bool operator()(const KeyView& a, const SharedObject& b) const { return a < keyOf(b); }
};
/// Objects by namespace and name.
using ObjectIndex = std::set<SharedObject, ByKey>;

enum class WatchOutcome : std::uint8_t { kEnded, kExpired, kFailed };

/// A failed request whose Status said 410 / Expired: the caller relists instead of backing off.
struct ExpiredError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A server's Retry-After beyond this is taken as this: a broken proxy must not stall kproxy.
constexpr auto kMaxRetryAfter = std::chrono::minutes(5);

/// A 429 or 5xx answer: the server may say (Retry-After, whole seconds) how long to wait.
struct RejectedError : std::runtime_error {
  RejectedError(const std::string& what, std::chrono::seconds wait) : std::runtime_error(what), retryAfter(wait) {}
  std::chrono::seconds retryAfter;
};

/// client-go's checkWait: Retry-After counts on 429 and 5xx only, in whole seconds.
std::chrono::seconds retryAfter(http::status status, std::string_view header) {
  const auto code = static_cast<unsigned>(status);
  if (code != 429 && code < 500) return std::chrono::seconds(0);
  unsigned seconds = 0;
  auto [end, ec] = std::from_chars(header.data(), header.data() + header.size(), seconds);
  if (ec != std::errc{} || end != header.data() + header.size()) return std::chrono::seconds(0);
  return std::min<std::chrono::seconds>(std::chrono::seconds(seconds), kMaxRetryAfter);
}

/// Throws the failure of a request answered with `status`.
[[noreturn]] void throwRejected(std::string what, http::status status, std::string_view retryAfterHeader) {
  auto wait = retryAfter(status, retryAfterHeader);
  if (wait.count() > 0) throw RejectedError(what, wait);
  throw std::runtime_error(what);
}

/// An optional resource the server does not serve (404) or will not show us (401, 403).
struct UnavailableError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Resource::decode for a decoder of one kind of object.
template <auto decodeKind>
core::Result<SharedObject> decodeObject(const json& j) {
  auto o = decodeKind(j);
  if (!o) return std::unexpected(o.error());
  using T = std::decay_t<decltype(*o)>;
  return SharedObject{std::make_shared<const T>(std::move(*o))};
}

struct Resource {
  std::string kind;  // "Service", for logs
  std::string path;  // "/api/v1/services"
  std::string labelSelector;
  std::string fieldSelector;
  std::function<core::Result<SharedObject>(const json&)> decode;
  std::function<void(const SharedObject&)> upsert;
  std::function<void(const KeyView&)> remove;
  std::function<void()> synced;  // may be empty (Node)
  /// Optional: until its first successful LIST, a server without the resource (404) or RBAC
  /// that refuses it (401, 403) means "no such objects", logged once, not a failure
  /// (ServiceCIDR: older servers, old RBAC). Once listed, a refusal is an ordinary failure:
  /// what is held stays (an apiserver's RBAC cache refuses for a moment after a restart).
  bool optional = false;
  bool unavailable = false;
  /// Called once, after the first LIST attempt ends whichever way (may be empty).
  std::function<void()> firstAttemptDone;

  ObjectIndex held;
  std::string resourceVersion;
  bool listed = false;
  bool watching = false;
};

/// Returns freed heap pages to the system.
void releaseFreeHeap() {
#ifdef __GLIBC__
  malloc_trim(0);
#endif
}

/// Namespace and name from raw metadata, tolerating a broken object (for log lines and DELETED).
Key keyOfRaw(const json& object) {
  Key key;
  auto meta = object.find("metadata");
  if (meta != object.end() && meta->is_object()) {
    if (auto ns = meta->find("namespace"); ns != meta->end() && ns->is_string()) key.first = ns->get<std::string>();
    if (auto name = meta->find("name"); name != meta->end() && name->is_string()) key.second = name->get<std::string>();
  }
  return key;
}

std::string describe(const Resource& r, const KeyView& key) {
  if (key.first.empty()) return fmt::format("{} {}", r.kind, key.second.empty() ? "<unnamed>" : key.second);
  return fmt::format("{} {}/{}", r.kind, key.first, key.second);
}

std::string statusText(const json& body, http::status status) {
  auto decoded = decodeStatus(body);
  if (decoded && !decoded->message.empty())
    return fmt::format("{} {}: {}", static_cast<unsigned>(status), decoded->reason, decoded->message);
  return fmt::format("{}", static_cast<unsigned>(status));
}

bool isExpired(http::status status, const json& body) {
  if (status == http::status::gone) return true;
  auto decoded = decodeStatus(body);
  return decoded && (decoded->code == 410 || decoded->reason == "Expired" || decoded->reason == "Gone");
}

}  // namespace

struct ApiSource::Impl {
  ClientConfig config;
  core::EventSink& sink;
  ApiSourceOptions options;
  std::shared_ptr<asio::ssl::context> tls;
  std::vector<std::unique_ptr<Resource>> resources;
  std::mt19937_64 random{std::random_device{}()};

  // Token bucket: `tokens` may go negative; a request that takes a token below zero waits until
  // the bucket has refilled to where its token would have been.
  double tokens = 0;
  SteadyClock::time_point lastRefill = SteadyClock::now();

  mutable std::mutex statsMutex;
  ApiSourceStats counters;
  bool wasConnected = false;
  bool started = false;
  // servicesSynced() waits for both (see addResources).
  bool servicesListed = false;
  bool serviceCIDRsAttempted = false;
  std::atomic<bool> stopping{false};
  /// The rest_client_* metrics' host label (empty without requestMetrics).
  std::string metricsHost;
  std::thread thread;
  // Last: destroyed first, so suspended coroutines (which reference the members above, and
  // whose destructors report unanswered requests to the metrics) are destroyed while those
  // members still exist. Every member goes above this one.
  asio::io_context io{1};

  Impl(ClientConfig c, core::EventSink& s, ApiSourceOptions o)
      : config(std::move(c)), sink(s), options(std::move(o)), tokens(std::max(1, config.burst)) {
    if (config.requestMetrics) metricsHost = apiwatch::metricsHost(config.server);
  }

  template <typename F>
  void count(F&& f) {
    std::lock_guard lock(statsMutex);
    f(counters);
  }

  void updateConnected() {
    bool all = std::all_of(resources.begin(), resources.end(),
                           [](const auto& r) { return r->watching || r->unavailable; });
    count([&](ApiSourceStats& s) { s.connected = all; });
    if (all != wasConnected && !stopping) {
      wasConnected = all;
      if (all) {
        log::info(0, "API server connection established; watching", {{"server", config.serverText}});
      } else {
        log::warning("API server watch interrupted; resuming", {{"server", config.serverText}});
      }
    }
  }

  SteadyClock::duration jittered(SteadyClock::duration base) {
    std::uniform_real_distribution<double> factor(0.5, 1.5);
    return std::chrono::duration_cast<SteadyClock::duration>(base * factor(random));
  }

  Task<void> sleep(SteadyClock::duration d) {
    asio::steady_timer timer(co_await asio::this_coro::executor);
    timer.expires_after(d);
    co_await timer.async_wait(asio::use_awaitable);
  }

  void requestDone(std::string_view code) {
    if (config.requestMetrics) config.requestMetrics->requestDone("GET", metricsHost, code);
  }
  void requestLatency(SteadyClock::time_point started) {
    if (config.requestMetrics)
      config.requestMetrics->requestLatency("GET", metricsHost,
                                            std::chrono::duration<double>(SteadyClock::now() - started).count());
  }

  Task<void> rateLimit() {
    if (config.qps <= 0) co_return;
    const auto started = SteadyClock::now();
    struct Observe {
      Impl& impl;
      SteadyClock::time_point started;
      // Also when the wait is cut short (stop): the time was spent waiting.
      ~Observe() {
        if (impl.config.requestMetrics)
          impl.config.requestMetrics->rateLimiterWait(
              "GET", impl.metricsHost, std::chrono::duration<double>(SteadyClock::now() - started).count());
      }
    } observe{*this, started};
    auto now = SteadyClock::now();
    double burst = std::max(1, config.burst);
    tokens = std::min(burst, tokens + std::chrono::duration<double>(now - lastRefill).count() * config.qps);
    lastRefill = now;
    tokens -= 1;
    if (tokens < 0) co_await sleep(std::chrono::duration_cast<SteadyClock::duration>(
                        std::chrono::duration<double>(-tokens / config.qps)));
  }

  std::string query(const Resource& r) const {
    std::string q;
    if (!r.labelSelector.empty()) q += "&labelSelector=" + detail::queryEscape(r.labelSelector);
    if (!r.fieldSelector.empty()) q += "&fieldSelector=" + detail::queryEscape(r.fieldSelector);
    return q;
  }

  /// `limited`: wait for the client-side rate limit (every request but the continuation pages
  /// of one LIST, which are one logical request: a 10,000-object list is 20 pages, and at
  /// kube-proxy's default 5 QPS the limit alone would add seconds to the start).
  Task<std::unique_ptr<Connection>> connect(bool limited = true) {
    if (limited) co_await rateLimit();
    count([](ApiSourceStats& s) { ++s.requests; });
    co_return co_await Connection::open(config, tls.get(), options.requestTimeout);
  }

  /// LIST all pages; on success `r.held` matches the server and deliveries are done.
  Task<void> list(Resource& r) {
    ObjectIndex fresh;
    std::string continueToken;
    std::string listVersion;
    std::uint64_t skipped = 0;
    std::uint64_t bodyBytes = 0;
    auto take = [&](const json& item) {
      auto decoded = r.decode(item);
      if (!decoded) {
        Key key = keyOfRaw(item);
        ++skipped;
        log::warning("skipping object that cannot be decoded",
                     {{"object", describe(r, view(key))}, {"reason", decoded.error().message()}});
        // An undecodable new version must not delete the last good one.
        if (auto held = r.held.find(view(key)); held != r.held.end()) fresh.insert(*held);
        return;
      }
      // A relist returns every object again. One equal to the held one stays the held one,
      // which the sink keeps too: a fresh copy would be kept beside it from then on.
      SharedObject object = std::move(*decoded);
      if (auto held = r.held.find(keyOf(object)); held != r.held.end() && sameObject(*held, object))
        object = *held;
      if (auto dup = fresh.find(keyOf(object)); dup != fresh.end()) fresh.erase(dup);
      fresh.insert(std::move(object));
    };
    for (;;) {
      auto target = fmt::format("{}?limit={}{}", r.path, options.pageSize, query(r));
      if (!continueToken.empty()) target += "&continue=" + detail::queryEscape(continueToken);
      // Each page is one request to the metrics, answered or not, as client-go counts it.
      const auto started = SteadyClock::now();
      bool answered = false;
      struct PageMetrics {
        Impl& impl;
        SteadyClock::time_point started;
        const bool& answered;
        ~PageMetrics() {
          if (!answered) impl.requestDone(kRequestErrorCode);
          impl.requestLatency(started);
        }
      } pageMetrics{*this, started, answered};
      auto connection = co_await connect(continueToken.empty());
      auto request = detail::makeGet(config, target);
      connection->expiresAfter(options.requestTimeout);
      co_await connection->write(request);
      auto response = co_await connection->readResponse(kMaxListBody);
      connection->close();
      answered = true;
      requestDone(std::to_string(response.result_int()));
      bodyBytes += response.body().size();
      const bool listed = response.result() == http::status::ok;
      // Each item is decoded when the parser has read it, then dropped from the document: a
      // page never exists as one tree (500 EndpointSlices of 10 endpoints were 7 MiB of one).
      std::string topKey;
      auto eachItem = [&](int depth, json::parse_event_t event, json& parsed) {
        if (depth == 1 && event == json::parse_event_t::key && parsed.is_string())
          topKey = parsed.get<std::string>();
        if (listed && depth == 2 && event == json::parse_event_t::object_end && topKey == "items") {
          take(parsed);
          return false;
        }
        return true;
      };
      json body = json::parse(response.body(), eachItem, false);
      if (!listed) {
        // An expired continue token (410) restarts the LIST from the beginning.
        if (isExpired(response.result(), body) && !continueToken.empty()) {
          log::info(1, "list continue token expired; restarting the list", {{"resource", r.kind}});
          fresh.clear();
          continueToken.clear();
          skipped = 0;
          continue;
        }
        const auto status = response.result();
        if (r.optional && (status == http::status::not_found || status == http::status::forbidden ||
                           status == http::status::unauthorized))
          throw UnavailableError(fmt::format("LIST {}: {}", r.path, statusText(body, status)));
        throwRejected(fmt::format("LIST {}: {}", r.path, statusText(body, status)), status,
                      std::string(response[http::field::retry_after]));
      }
      if (!body.is_object() || !body.contains("items") || !(body["items"].is_array() || body["items"].is_null()))
        throw std::runtime_error(fmt::format("LIST {}: the answer is not a list", r.path));
      // The parser kept only the items that are not objects; they fail to decode as ever.
      if (body["items"].is_array())
        for (const auto& item : body["items"]) take(item);
      const json& meta = body.contains("metadata") && body["metadata"].is_object() ? body["metadata"] : json::object();
      listVersion = meta.value("resourceVersion", std::string{});
      continueToken = meta.value("continue", std::string{});
      if (continueToken.empty()) break;
    }

    count([&](ApiSourceStats& s) {
      s.decodeFailures += skipped;
      ++s.lists;
      if (r.listed) ++s.relists;
    });
    // Reconcile: deletes for vanished objects, upserts for new or changed ones only.
    std::size_t deleted = 0, upserted = 0;
    for (const auto& object : r.held) {
      if (!fresh.contains(keyOf(object))) {
        r.remove(keyOf(object));
        ++deleted;
      }
    }
    for (const auto& object : fresh) {
      auto held = r.held.find(keyOf(object));
      if (held == r.held.end() || !sameObject(*held, object)) {
        r.upsert(object);
        ++upserted;
      }
    }
    log::info(r.listed ? 0 : 1, r.listed ? "relisted" : "listed",
              {{"resource", r.kind}, {"objects", std::to_string(fresh.size())},
               {"upserted", std::to_string(upserted)}, {"deleted", std::to_string(deleted)},
               {"resourceVersion", listVersion}});
    r.held = std::move(fresh);
    r.resourceVersion = listVersion;
    if (r.unavailable) {
      r.unavailable = false;
      log::info(0, "optional resource is readable again", {{"resource", r.kind}, {"path", r.path}});
    }
    // Before the sink is told: the first sync, which the initial lists let start, builds its
    // kernel batch on top of what is resident now, and malloc keeps freed pages mapped unless
    // asked.
    if (bodyBytes >= kTrimAfterListBytes) releaseFreeHeap();
    if (!r.listed) {
      r.listed = true;
      if (r.synced) r.synced();
    }
  }

  void applyEvent(Resource& r, WatchEvent& event) {
    if (!event.resourceVersion.empty()) r.resourceVersion = event.resourceVersion;
    if (event.type == WatchEventType::kBookmark) {
      count([](ApiSourceStats& s) { ++s.bookmarks; });
      return;
    }
    Key key = keyOfRaw(event.object);
    if (event.type == WatchEventType::kDeleted) {
      count([](ApiSourceStats& s) { ++s.watchEvents; });
      if (auto held = r.held.find(view(key)); held != r.held.end()) {
        r.held.erase(held);
        r.remove(view(key));
      }
      return;
    }
    auto decoded = r.decode(event.object);
    if (!decoded) {
      count([](ApiSourceStats& s) { ++s.decodeFailures; });
      log::warning("skipping object that cannot be decoded",
                   {{"object", describe(r, view(key))}, {"event", toString(event.type)},
                    {"reason", decoded.error().message()}});
      return;
    }
    count([](ApiSourceStats& s) { ++s.watchEvents; });
    SharedObject object = std::move(*decoded);
    auto held = r.held.find(keyOf(object));
    if (held != r.held.end()) {
      if (sameObject(*held, object)) return;
      r.held.erase(held);
    }
    r.upsert(object);
    r.held.insert(std::move(object));
  }

  Task<WatchOutcome> watch(Resource& r) {
    long base = std::max<long>(1, options.watchTimeout.count());
    std::uniform_int_distribution<long> spread(base, 2 * base - 1);
    std::chrono::seconds timeout(spread(random));
    auto target = fmt::format("{}?watch=1&allowWatchBookmarks=true&resourceVersion={}&timeoutSeconds={}{}", r.path,
                              detail::queryEscape(r.resourceVersion), timeout.count(), query(r));
    // A watch counts by its answer's status; client-go times no watch (it lasts minutes).
    bool answered = false;
    struct WatchMetrics {
      Impl& impl;
      const bool& answered;
      ~WatchMetrics() {
        if (!answered) impl.requestDone(kRequestErrorCode);
      }
    } watchMetrics{*this, answered};
    auto connection = co_await connect();
    auto request = detail::makeGet(config, target);
    connection->expiresAfter(options.requestTimeout);
    co_await connection->write(request);
    http::response_parser<http::buffer_body> parser;
    parser.body_limit(std::numeric_limits<std::uint64_t>::max());
    co_await connection->readHeader(parser);
    answered = true;
    requestDone(std::to_string(parser.get().result_int()));
    WatchLineSplitter stream(kMaxEventLine);
    std::string& data = stream.data();
    if (parser.get().result() != http::status::ok) {
      while (data.size() < kMaxErrorBody && co_await connection->readSome(parser, data)) {
      }
      json body = json::parse(data, nullptr, false);
      if (isExpired(parser.get().result(), body)) co_return WatchOutcome::kExpired;
      throwRejected(fmt::format("WATCH {}: {}", r.path, statusText(body, parser.get().result())),
                    parser.get().result(), std::string(parser.get()[http::field::retry_after]));
    }
    count([](ApiSourceStats& s) { ++s.watchesOpened; });
    // "Connected" ends only with a failure (see run()): a watch that the server ends on its
    // timeout is resumed at once and is not worth a log line.
    r.watching = true;
    updateConnected();
    log::info(2, "watch opened", {{"resource", r.kind}, {"resourceVersion", r.resourceVersion}});
    // The server ends the watch after `timeout`; one that outlives it by the grace period is
    // stuck. (Quiet periods are normal: the apiserver sends no bookmark on an idle resource.)
    auto deadline = SteadyClock::now() + timeout + options.watchGrace;
    for (;;) {
      connection->expiresAfter(deadline - SteadyClock::now());
      if (!co_await connection->readSome(parser, data)) break;
      while (auto line = stream.nextLine()) {
        json parsed = json::parse(*line, nullptr, false);
        if (parsed.is_discarded()) {
          // A broken line means a broken stream: reopen from the last good resourceVersion.
          throw std::runtime_error(fmt::format("WATCH {}: undecodable event line", r.path));
        }
        auto event = decodeWatchEvent(std::move(parsed));
        if (!event) {
          count([](ApiSourceStats& s) { ++s.decodeFailures; });
          log::warning("skipping undecodable watch event", {{"resource", r.kind}, {"reason", event.error().message()}});
          continue;
        }
        if (event->type == WatchEventType::kError) {
          const ApiStatus status = event->status.value_or(ApiStatus{});
          if (status.code == 410 || status.reason == "Expired" || status.reason == "Gone")
            co_return WatchOutcome::kExpired;
          throw std::runtime_error(fmt::format("WATCH {}: error event {} {}: {}", r.path, status.code,
                                               status.reason, status.message));
        }
        applyEvent(r, *event);
      }
      if (!stream.compact()) throw std::runtime_error(fmt::format("WATCH {}: event line too long", r.path));
    }
    co_return WatchOutcome::kEnded;
  }

  Task<void> run(Resource& r) {
    auto backoff = std::chrono::duration_cast<SteadyClock::duration>(options.initialBackoff);
    auto nextBackoff = [&] {
      auto d = jittered(backoff);
      backoff = std::min<SteadyClock::duration>(backoff * 2, options.maxBackoff);
      return std::min<SteadyClock::duration>(d, options.maxBackoff);
    };
    bool needList = true;
    auto attempted = [&r] {
      if (auto done = std::exchange(r.firstAttemptDone, nullptr)) done();
    };
    for (;;) {
      std::string failure;
      std::chrono::seconds serverWait{0};
      bool unavailable = false;
      try {
        if (needList) {
          co_await list(r);
          needList = false;
          attempted();
        }
        auto opened = SteadyClock::now();
        auto outcome = co_await watch(r);
        if (outcome == WatchOutcome::kExpired) {
          count([](ApiSourceStats& s) { ++s.expired; });
          log::info(0, "watch resourceVersion expired; relisting",
                    {{"resource", r.kind}, {"resourceVersion", r.resourceVersion}});
          needList = true;
          continue;
        }
        log::info(2, "watch ended", {{"resource", r.kind}, {"resourceVersion", r.resourceVersion}});
        // A watch that ran for a while ended normally (server timeout): resume at once.
        if (SteadyClock::now() - opened > std::chrono::seconds(5)) {
          backoff = options.initialBackoff;
          continue;
        }
        failure = "watch ended right after it was opened";
      } catch (const UnavailableError& e) {
        failure = e.what();
        unavailable = true;
      } catch (const RejectedError& e) {
        failure = e.what();
        serverWait = e.retryAfter;
      } catch (const boost::system::system_error& e) {
        if (e.code() == asio::error::operation_aborted && io.stopped()) throw;
        failure = e.code() == boost::beast::error::timeout ? "timed out" : e.what();
      } catch (const std::exception& e) {
        failure = e.what();
      }
      attempted();
      if (unavailable && !r.listed) {
        // Nothing was ever listed: the resource is empty as far as kproxy knows. Asked again
        // with the usual backoff, quietly.
        if (!r.unavailable) {
          log::warning("optional resource cannot be read; treating it as empty",
                       {{"resource", r.kind}, {"server", config.serverText}, {"error", failure}});
        } else {
          log::info(2, "optional resource still cannot be read", {{"resource", r.kind}, {"error", failure}});
        }
        r.unavailable = true;
        updateConnected();
        co_await sleep(nextBackoff());
        continue;
      }
      count([](ApiSourceStats& s) { ++s.requestFailures; });
      r.watching = false;
      updateConnected();
      // The server's Retry-After when it gave one (and it is longer), else our own backoff.
      auto wait = std::max<SteadyClock::duration>(nextBackoff(), serverWait);
      log::warning("API request failed; retrying",
                   {{"resource", r.kind}, {"server", config.serverText}, {"error", failure},
                    {"retryIn", fmt::format("{}ms", std::chrono::duration_cast<std::chrono::milliseconds>(wait).count())}});
      co_await sleep(wait);
    }
  }

  void addResources() {
    auto svc = std::make_unique<Resource>();
    svc->kind = "Service";
    svc->path = "/api/v1/services";
    svc->labelSelector = kProxyLabelSelector;
    svc->decode = decodeObject<decodeService>;
    svc->upsert = [this](const SharedObject& o) {
      sink.sharedServiceUpserted(std::get<std::shared_ptr<const core::Service>>(o));
    };
    svc->remove = [this](const KeyView& k) {
      sink.serviceDeleted(std::string(k.first), std::string(k.second));
    };
    // Services count as listed once the ServiceCIDRs have been asked for too, so that the
    // first sync (and `kproxy explain`) knows them when the server has them.
    svc->synced = [this] {
      servicesListed = true;
      if (serviceCIDRsAttempted) sink.servicesSynced();
    };
    resources.push_back(std::move(svc));

    auto eps = std::make_unique<Resource>();
    eps->kind = "EndpointSlice";
    eps->path = "/apis/discovery.k8s.io/v1/endpointslices";
    // Upstream uses one informer factory, hence one selector, for Services and EndpointSlices;
    // the EndpointSlice controller copies both labels onto the slices of such services.
    eps->labelSelector = kProxyLabelSelector;
    eps->decode = decodeObject<decodeEndpointSlice>;
    eps->upsert = [this](const SharedObject& o) {
      sink.sharedEndpointSliceUpserted(std::get<std::shared_ptr<const core::EndpointSlice>>(o));
    };
    eps->remove = [this](const KeyView& k) {
      sink.endpointSliceDeleted(std::string(k.first), std::string(k.second));
    };
    eps->synced = [this] { sink.endpointSlicesSynced(); };
    resources.push_back(std::move(eps));

    auto cidrs = std::make_unique<Resource>();
    cidrs->kind = "ServiceCIDR";
    cidrs->path = "/apis/networking.k8s.io/v1/servicecidrs";
    cidrs->optional = true;
    cidrs->decode = decodeObject<decodeServiceCIDR>;
    cidrs->upsert = [this](const SharedObject& o) {
      sink.serviceCIDRUpserted(*std::get<std::shared_ptr<const core::ServiceCIDR>>(o));
    };
    cidrs->remove = [this](const KeyView& k) { sink.serviceCIDRDeleted(std::string(k.second)); };
    cidrs->firstAttemptDone = [this] {
      serviceCIDRsAttempted = true;
      if (servicesListed) sink.servicesSynced();
    };
    resources.push_back(std::move(cidrs));

    if (!options.nodeName.empty()) {
      auto node = std::make_unique<Resource>();
      node->kind = "Node";
      node->path = "/api/v1/nodes";
      node->fieldSelector = "metadata.name=" + options.nodeName;
      node->decode = decodeObject<decodeNode>;
      node->upsert = [this](const SharedObject& o) {
        sink.nodeUpserted(*std::get<std::shared_ptr<const core::Node>>(o));
      };
      node->remove = [this](const KeyView& k) { sink.nodeDeleted(std::string(k.second)); };
      resources.push_back(std::move(node));
    }
  }
};

ApiSource::ApiSource(ClientConfig config, core::EventSink& sink, ApiSourceOptions options)
    : impl_(std::make_unique<Impl>(std::move(config), sink, std::move(options))) {}

ApiSource::~ApiSource() { stop(); }

core::Result<void> ApiSource::start() {
  if (impl_->started) return core::makeError(core::ErrorCategory::kInternal, "ApiSource started twice");
  if (auto transport = checkCredentialTransport(impl_->config); !transport)
    return std::unexpected(transport.error());
  if (impl_->config.server.tls) {
    auto tls = detail::makeTlsContext(impl_->config);
    if (!tls) return std::unexpected(tls.error());
    impl_->tls = std::move(*tls);
  }
  impl_->started = true;
  impl_->addResources();
  for (auto& r : impl_->resources) {
    asio::co_spawn(impl_->io, impl_->run(*r), [kind = r->kind](std::exception_ptr e) {
      if (!e) return;
      try {
        std::rethrow_exception(e);
      } catch (const boost::system::system_error& error) {
        if (error.code() == asio::error::operation_aborted) return;
        log::error("API watcher stopped", {{"resource", kind}, {"error", error.what()}});
      } catch (const std::exception& error) {
        log::error("API watcher stopped", {{"resource", kind}, {"error", error.what()}});
      }
    });
  }
  log::info(0, "watching the API server",
            {{"server", impl_->config.serverText}, {"config", impl_->config.origin},
             {"verifyTls", impl_->config.server.tls && !impl_->config.insecureSkipTlsVerify ? "true" : "false"},
             {"node", impl_->options.nodeName}});
  impl_->thread = std::thread([impl = impl_.get()] { impl->io.run(); });
  return {};
}

void ApiSource::stop() {
  if (!impl_ || !impl_->thread.joinable()) return;
  impl_->stopping = true;
  impl_->io.stop();
  impl_->thread.join();
}

ApiSourceStats ApiSource::stats() const {
  std::lock_guard lock(impl_->statsMutex);
  return impl_->counters;
}

}  // namespace kproxy::apiwatch
