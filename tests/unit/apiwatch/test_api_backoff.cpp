// How ApiSource treats an API server that refuses: 401 backs off exponentially and recovers; 429
// and 5xx with Retry-After wait as long as the server asks (client-go's checkWait), then recover.
// Against a scripted fake server on 127.0.0.1 (port 0) that records when each request came.
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <fmt/format.h>

#include "kproxy/apiwatch/api_source.h"
#include "kproxy/core/log.h"
#include "loopback_server.h"

using namespace kproxy;
using namespace std::chrono_literals;
using SteadyClock = std::chrono::steady_clock;

namespace {

/// Answers Service LISTs from a script of raw status lines + headers, then with an empty list;
/// every other LIST with an empty list; every WATCH with a stream that stays open.
class ScriptedApiServer {
 public:
  explicit ScriptedApiServer(std::deque<std::string> serviceListAnswers) : script_(std::move(serviceListAnswers)) {
    port = server_.port();
  }
  ~ScriptedApiServer() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    stopped_.notify_all();
  }

  int port = 0;

  /// When each Service LIST arrived.
  std::vector<SteadyClock::time_point> serviceLists() {
    std::lock_guard lock(mutex_);
    return serviceLists_;
  }

 private:
  void serve(int fd, const std::string& target) {
    if (target.find("watch=1") != std::string::npos) {
      testing::sendAll(fd, testing::kChunkedJsonHead);
      std::unique_lock lock(mutex_);
      stopped_.wait(lock, [&] { return stopping_; });
    } else {
      std::string answer;
      {
        std::lock_guard lock(mutex_);
        if (target.starts_with("/api/v1/services?")) {
          serviceLists_.push_back(SteadyClock::now());
          if (!script_.empty()) {
            answer = std::move(script_.front());
            script_.pop_front();
          }
        }
      }
      if (answer.empty()) {
        answer = testing::jsonResponse(
            "200 OK", R"({"kind":"List","apiVersion":"v1","metadata":{"resourceVersion":"1"},"items":[]})");
      }
      testing::sendAll(fd, answer);
    }
  }

  std::mutex mutex_;
  std::condition_variable stopped_;
  bool stopping_ = false;
  std::deque<std::string> script_;
  std::vector<SteadyClock::time_point> serviceLists_;
  // Last, so that it stops (joining the connections) while the members above are still there.
  testing::LoopbackServer server_{[this](int fd, const std::string& target) { serve(fd, target); }};
};

std::string failure(int code, const std::string& reason, const std::string& extraHeaders = "") {
  const std::string body = fmt::format(
      R"({{"kind":"Status","apiVersion":"v1","status":"Failure","message":"{}","reason":"{}","code":{}}})", reason,
      reason, code);
  return testing::jsonResponse(fmt::format("{} {}", code, reason), body, extraHeaders);
}

class SyncedSink final : public core::EventSink {
 public:
  void serviceUpserted(core::Service) override {}
  void serviceDeleted(const std::string&, const std::string&) override {}
  void endpointSliceUpserted(core::EndpointSlice) override {}
  void endpointSliceDeleted(const std::string&, const std::string&) override {}
  void nodeUpserted(core::Node) override {}
  void nodeDeleted(const std::string&) override {}
  void servicesSynced() override {
    std::lock_guard lock(mutex_);
    synced_ = true;
    cv_.notify_all();
  }
  void endpointSlicesSynced() override {}
  bool waitSynced(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mutex_);
    return cv_.wait_for(lock, timeout, [&] { return synced_; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool synced_ = false;
};

struct Run {
  std::vector<SteadyClock::time_point> lists;
  bool synced = false;
};

// How long a test waits for the source to sync before it takes it for a hang: a ceiling, never
// a measure (the machine may be slow, loaded, or running sanitizers). The times asserted below
// are lower bounds, which hold on any machine.
constexpr auto kHang = 60s;

// Starts an ApiSource against `server` with a fast backoff (10 ms doubling to 80 ms) and waits
// for the Service list to succeed (at most kHang).
Run runAgainst(ScriptedApiServer& server, std::chrono::milliseconds timeout = kHang) {
  auto previous = log::setSink([](log::Severity, std::string_view) {});
  SyncedSink sink;
  apiwatch::ClientConfig config = testing::loopbackClientConfig(server.port);
  apiwatch::ApiSourceOptions options;
  options.initialBackoff = 10ms;
  options.maxBackoff = 80ms;
  apiwatch::ApiSource source(config, sink, options);
  REQUIRE(source.start());
  Run run;
  run.synced = sink.waitSynced(timeout);
  source.stop();
  log::setSink(previous);
  run.lists = server.serviceLists();
  return run;
}

std::chrono::milliseconds gap(const Run& run, std::size_t i) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(run.lists.at(i + 1) - run.lists.at(i));
}

}  // namespace

TEST_CASE("ApiSource backs off on 401 Unauthorized and recovers when the server accepts again", "[unit]") {
  ScriptedApiServer server({failure(401, "Unauthorized"), failure(401, "Unauthorized"), failure(401, "Unauthorized"),
                            failure(401, "Unauthorized")});
  auto run = runAgainst(server);
  CHECK(run.synced);
  REQUIRE(run.lists.size() == 5);
  // Never hammering: each retry waits at least half the (doubling) backoff.
  CHECK(gap(run, 0) >= 5ms);
  CHECK(gap(run, 2) >= 20ms);
  CHECK(gap(run, 3) >= 40ms);
}

TEST_CASE("ApiSource waits as long as a 429's Retry-After asks, then recovers", "[unit]") {
  ScriptedApiServer server({failure(429, "TooManyRequests", "Retry-After: 1\r\n")});
  auto run = runAgainst(server);
  CHECK(run.synced);
  REQUIRE(run.lists.size() == 2);
  CHECK(gap(run, 0) >= 950ms);  // the backoff alone would be 5–15 ms
}

TEST_CASE("ApiSource waits as long as a 503's Retry-After asks, then recovers", "[unit]") {
  ScriptedApiServer server({failure(503, "ServiceUnavailable", "Retry-After: 2\r\n")});
  auto run = runAgainst(server);
  CHECK(run.synced);
  REQUIRE(run.lists.size() == 2);
  CHECK(gap(run, 0) >= 1950ms);
}

TEST_CASE("ApiSource ignores Retry-After outside 429 and 5xx, and a 5xx without one backs off", "[unit]") {
  // client-go honours Retry-After only on 429 and 5xx; a 500 without it is an ordinary failure.
  // Honouring the 403's Retry-After (the most there is: 5 min) would not sync within kHang.
  ScriptedApiServer server({failure(403, "Forbidden", "Retry-After: 300\r\n"), failure(500, "InternalError")});
  auto run = runAgainst(server);
  CHECK(run.synced);
  REQUIRE(run.lists.size() == 3);
  CHECK(gap(run, 0) < kHang);
  // The 500 is backed off from like any failure: the second backoff is 20 ms ± 50%.
  CHECK(gap(run, 1) >= 10ms);
}
