#include <catch2/catch.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>

#include <mutex>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "kproxy/core/log.h"

namespace klog = kproxy::log;

namespace {

struct Capture {
  Capture() {
    previous = klog::setSink([this](klog::Severity s, std::string_view line) {
      std::lock_guard lock(mutex);
      severities.push_back(s);
      lines.emplace_back(line);
    });
    previousVerbosity = klog::verbosity();
  }
  ~Capture() {
    klog::setSink(previous);
    klog::setVerbosity(previousVerbosity);
  }
  std::mutex mutex;
  std::vector<klog::Severity> severities;
  std::vector<std::string> lines;
  klog::Sink previous;
  int previousVerbosity = 0;
};

}  // namespace

TEST_CASE("line format: header, quoted message, key=value fields", "[unit][log]") {
  Capture c;
  klog::info(0, "synced rules", {{"kind", "partial"}, {"changed", "3"}});
  REQUIRE(c.lines.size() == 1);
  const std::regex header(R"(^I\d{4} \d{2}:\d{2}:\d{2}\.\d{6} kproxy\] )");
  CHECK(std::regex_search(c.lines[0], header));
  CHECK(c.lines[0].ends_with(R"("synced rules" kind=partial changed=3)"));
}

TEST_CASE("values with spaces, quotes or '=' are quoted and escaped", "[unit][log]") {
  Capture c;
  klog::warning("m", {{"a", "two words"}, {"b", "x=y"}, {"c", R"(say "hi")"}, {"d", ""}, {"e", "plain"}});
  REQUIRE(c.lines.size() == 1);
  CHECK(c.lines[0].ends_with(R"("m" a="two words" b="x=y" c="say \"hi\"" d="" e=plain)"));
  CHECK(c.lines[0][0] == 'W');
  CHECK(c.severities[0] == klog::Severity::kWarning);
}

TEST_CASE("severity letters and verbosity", "[unit][log]") {
  Capture c;
  klog::setVerbosity(2);
  klog::error("bad");
  klog::info(2, "shown");
  klog::info(3, "hidden");
  REQUIRE(c.lines.size() == 2);
  CHECK(c.lines[0][0] == 'E');
  CHECK(c.lines[1][0] == 'I');
  CHECK(c.lines[1].find("shown") != std::string::npos);
  CHECK(klog::enabled(2));
  CHECK_FALSE(klog::enabled(3));
}

TEST_CASE("setSink returns the previous sink; concurrent writers never interleave", "[unit][log]") {
  Capture c;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([t] {
      for (int i = 0; i < 200; ++i) klog::info(0, "line", {{"thread", std::to_string(t)}});
    });
  }
  for (auto& t : threads) t.join();
  REQUIRE(c.lines.size() == 800);
  for (const auto& line : c.lines) CHECK(line.ends_with(R"("line" thread=)" + line.substr(line.size() - 1)));

  std::vector<std::string> other;
  auto mine = klog::setSink([&](klog::Severity, std::string_view l) { other.emplace_back(l); });
  klog::info(0, "to other");
  auto back = klog::setSink(std::move(mine));
  CHECK(other.size() == 1);
  back(klog::Severity::kInfo, "direct");
  CHECK(other.size() == 2);
}

namespace {

// A structured sink as an embedder writes one: it keeps what it needs from each record.
struct KeptRecord {
  klog::Severity severity;
  std::string message;
  std::vector<std::pair<std::string, std::string>> fields;
  std::string line;
};
class RecordingSink final : public klog::LogSink {
 public:
  void write(const klog::Record& r) override {
    KeptRecord kept{r.severity, std::string(r.message), {}, klog::formatLine(r)};
    for (const auto& [k, v] : r.fields) kept.fields.emplace_back(k, v);
    records.push_back(std::move(kept));
  }
  std::vector<KeptRecord> records;
};

// Runs `body` with file descriptor 2 pointing at a temporary file and returns what was written.
template <typename Body>
std::string captureStderr(Body body) {
  char path[] = "/tmp/kproxy-test-log-XXXXXX";
  const int file = mkstemp(path);
  REQUIRE(file >= 0);
  std::fflush(stderr);
  const int saved = dup(2);
  REQUIRE(saved >= 0);
  dup2(file, 2);
  body();
  std::fflush(stderr);
  dup2(saved, 2);
  close(saved);
  close(file);
  std::ifstream in(path, std::ios::binary);
  std::string out((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  unlink(path);
  return out;
}

}  // namespace

TEST_CASE("a LogSink receives each event unformatted, and nothing reaches stderr", "[unit][log]") {
  auto sink = std::make_shared<RecordingSink>();
  std::shared_ptr<klog::LogSink> previous;
  const std::string err = captureStderr([&] {
    previous = klog::setLogSink(sink);
    klog::warning("backend slow", {{"mode", "json"}, {"took", "2 s"}});
    klog::info(0, "plain");
    klog::setLogSink(previous);
  });
  CHECK(err.empty());
  REQUIRE(sink->records.size() == 2);
  CHECK(sink->records[0].severity == klog::Severity::kWarning);
  CHECK(sink->records[0].message == "backend slow");
  CHECK(sink->records[0].fields ==
        std::vector<std::pair<std::string, std::string>>{{"mode", "json"}, {"took", "2 s"}});
  CHECK(sink->records[0].line.ends_with(R"("backend slow" mode=json took="2 s")"));
  CHECK(sink->records[1].fields.empty());
}

TEST_CASE("the default output is the klog line on stderr, byte for byte", "[unit][log]") {
  auto previous = klog::setLogSink(nullptr);
  const std::string err = captureStderr([] {
    klog::error("sync failed", {{"error", "no \"table\""}, {"n", "1"}});
    klog::info(0, "second");
  });
  klog::setLogSink(previous);
  const std::regex expected(
      R"(^E\d{4} \d{2}:\d{2}:\d{2}\.\d{6} kproxy\] "sync failed" error="no \\"table\\"" n=1\n)"
      R"(I\d{4} \d{2}:\d{2}:\d{2}\.\d{6} kproxy\] "second"\n$)");
  CHECK(std::regex_match(err, expected));
}

TEST_CASE("setSink hands back a LogSink so that installing it again restores it", "[unit][log]") {
  auto sink = std::make_shared<RecordingSink>();
  auto original = klog::setLogSink(sink);
  std::vector<std::string> lines;
  auto displaced = klog::setSink([&](klog::Severity, std::string_view l) { lines.emplace_back(l); });
  klog::info(0, "to lines");
  klog::setSink(std::move(displaced));
  klog::info(0, "to records");
  CHECK(klog::setLogSink(original) == sink);
  REQUIRE(lines.size() == 1);
  REQUIRE(sink->records.size() == 1);
  CHECK(sink->records[0].message == "to records");
}
