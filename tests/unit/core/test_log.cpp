#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdio>
#include <chrono>
#include <cstdlib>
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

TEST_CASE("line format: klog's header with the thread and the caller's file:line", "[unit][log]") {
  Capture c;
  const int line = __LINE__ + 1;
  klog::info(0, "synced rules", {{"kind", "partial"}, {"changed", "3"}});
  REQUIRE(c.lines.size() == 1);
  const std::regex header(R"(^I\d{4} \d{2}:\d{2}:\d{2}\.\d{6} +(\d+) test_log\.cpp:(\d+)\] )");
  std::smatch m;
  REQUIRE(std::regex_search(c.lines[0], m, header));
  CHECK(std::stol(m[1]) == static_cast<long>(::syscall(SYS_gettid)));
  CHECK(std::stoi(m[2]) == line);
  CHECK(c.lines[0].ends_with(R"("synced rules" kind="partial" changed=3)"));
}

TEST_CASE("values: strings quoted and escaped as InfoS writes them, numbers and booleans bare",
          "[unit][log]") {
  Capture c;
  klog::warning("m", {{"a", "two words"}, {"b", "x=y"}, {"c", R"(say "hi")"}, {"d", ""}, {"e", "plain"},
                      {"n", "-12"}, {"f", "0.5"}, {"t", "true"}, {"lead", "007"}, {"dur", "1.2ms"},
                      {"ctl", "a\x01" "b\tc"}});
  REQUIRE(c.lines.size() == 1);
  CHECK(c.lines[0].ends_with(R"("m" a="two words" b="x=y" c="say \"hi\"" d="" e="plain" n=-12 f=0.5 t=true )"
                             R"(lead="007" dur="1.2ms" ctl="a\x01b\tc")"));
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
  CHECK(sink->records[0].line.ends_with(R"("backend slow" mode="json" took="2 s")"));
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
      R"(^E\d{4} \d{2}:\d{2}:\d{2}\.\d{6} +\d+ test_log\.cpp:\d+\] "sync failed" error="no \\"table\\"" n=1\n)"
      R"(I\d{4} \d{2}:\d{2}:\d{2}\.\d{6} +\d+ test_log\.cpp:\d+\] "second"\n$)");
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

namespace {

// A record at a fixed instant (2023-11-21 23:40:00.123456 UTC), formatted in UTC.
struct FixedRecord {
  FixedRecord() {
    const char* tz = std::getenv("TZ");
    if (tz != nullptr) savedTz = tz;
    hadTz = tz != nullptr;
    setenv("TZ", "UTC", 1);
    tzset();
    record.time = std::chrono::system_clock::time_point(std::chrono::microseconds(1700610000123456LL));
    record.message = "Synced rules";
    record.fields = fields;
    record.file = "../core/src/proxier.cpp";
    record.line = 214;
    record.verbosity = 2;
    record.threadId = 12345;
  }
  ~FixedRecord() {
    if (hadTz) {
      setenv("TZ", savedTz.c_str(), 1);
    } else {
      unsetenv("TZ");
    }
    tzset();
  }
  std::vector<klog::Field> fields{{"kind", "partial"}, {"changed", "3"}, {"full", "false"},
                                  {"took", "1.2ms"}};
  klog::Record record;
  std::string savedTz;
  bool hadTz = false;
};

}  // namespace

TEST_CASE("formatLine: klog's text line, byte for byte", "[unit][log]") {
  FixedRecord f;
  CHECK(klog::formatLine(f.record) ==
        R"(I1121 23:40:00.123456   12345 proxier.cpp:214] "Synced rules" kind="partial" changed=3 full=false took="1.2ms")");
  f.record.severity = klog::Severity::kError;
  f.record.file = "";
  f.record.line = 0;
  CHECK(klog::formatLine(f.record).starts_with("E1121 23:40:00.123456   12345 ???:0] "));
}

TEST_CASE("formatJson: component-base's JSON record, byte for byte", "[unit][log]") {
  FixedRecord f;
  // ts: milliseconds since the epoch as a float; caller: zap's short caller (dir/file:line);
  // "v" on info records only; the fields after, numbers and booleans as JSON's.
  CHECK(klog::formatJson(f.record) ==
        R"({"ts":1700610000123.456,"caller":"src/proxier.cpp:214","msg":"Synced rules","v":2,)"
        R"("kind":"partial","changed":3,"full":false,"took":"1.2ms"})");
  f.record.severity = klog::Severity::kWarning;
  f.record.verbosity = 0;
  CHECK(klog::formatJson(f.record).find(R"("msg":"Synced rules","v":0,"kind")") != std::string::npos);
  f.record.severity = klog::Severity::kError;
  std::vector<klog::Field> errFields{{"err", "no \"table\"\n\x01"}};
  f.record.fields = errFields;
  CHECK(klog::formatJson(f.record) ==
        R"({"ts":1700610000123.456,"caller":"src/proxier.cpp:214","msg":"Synced rules","err":"no \"table\"\n\u0001"})");
}

TEST_CASE("setFormat(kJson): the default output and line sinks write JSON records", "[unit][log]") {
  Capture c;
  klog::setFormat(klog::Format::kJson);
  const int line = __LINE__ + 1;
  klog::info(0, "json line", {{"n", "1"}});
  klog::setFormat(klog::Format::kText);
  REQUIRE(c.lines.size() == 1);
  const std::regex record(R"re(^\{"ts":\d+(\.\d+)?,"caller":"core/test_log\.cpp:(\d+)","msg":"json line","v":0,"n":1\}$)re");
  std::smatch m;
  REQUIRE(std::regex_match(c.lines[0], m, record));
  CHECK(std::stoi(m[2]) == line);
}

namespace {
struct VmoduleReset {
  ~VmoduleReset() { (void)klog::setVmodule({}); }
};
}  // namespace

TEST_CASE("--vmodule raises the level for the files it names; the first match decides", "[unit][log]") {
  Capture c;
  VmoduleReset reset;
  klog::setVerbosity(1);
  REQUIRE(klog::setVmodule({"test_log=3", "test_*=5"}));
  klog::info(3, "shown: this file at 3");
  klog::info(4, "hidden: this file above 3 (test_*=5 comes second)");
  CHECK(klog::enabled(3));
  CHECK_FALSE(klog::enabled(4));
  const klog::Field none[] = {{"k", "v"}};
  klog::writeAt(klog::Severity::kInfo, 1, "../backends/nftables/src/backend.cpp", 10, "shown: global 1", none);
  klog::writeAt(klog::Severity::kInfo, 2, "../backends/nftables/src/backend.cpp", 11, "hidden: other file", none);
  CHECK(klog::verbosityFor("../backends/nftables/src/backend.cpp") == 1);
  CHECK(klog::verbosityFor("../core/src/test_lag.cpp") == 5);

  // A pattern with '/' is matched against the path without its extension; globs as klog's.
  REQUIRE(klog::setVmodule({"backends/nftables/*=4", "prox?er.cpp=6"}));
  CHECK(klog::verbosityFor("../backends/nftables/src/backend.cpp") == 1);  // '*' stops at '/'
  REQUIRE(klog::setVmodule({"backends/nftables/src/*=4", "prox?er.cpp=6"}));
  CHECK(klog::verbosityFor("../backends/nftables/src/backend.cpp") == 4);
  CHECK(klog::verbosityFor("/abs/core/src/proxier.cpp") == 6);
  klog::writeAt(klog::Severity::kInfo, 4, "../backends/nftables/src/backend.cpp", 12, "shown: pattern with /", none);

  // The global level still counts: vmodule only raises.
  REQUIRE(klog::setVmodule({"proxier=0"}));
  CHECK(klog::verbosityFor("core/src/proxier.cpp") == 1);

  std::vector<std::string> shown;
  for (const auto& l : c.lines) shown.push_back(l.substr(l.find("] ") + 2));
  CHECK(shown == std::vector<std::string>{R"("shown: this file at 3")", R"("shown: global 1" k="v")",
                                          R"("shown: pattern with /" k="v")"});
}

TEST_CASE("--vmodule: a malformed item is refused and the patterns stay", "[unit][log]") {
  VmoduleReset reset;
  const int global = klog::verbosity();
  REQUIRE(klog::setVmodule({"proxier=7"}));
  for (const char* bad : {"proxier", "=3", "proxier=-1", "proxier=x", "proxier="}) {
    CAPTURE(bad);
    CHECK_FALSE(klog::setVmodule({bad}));
  }
  CHECK(klog::verbosityFor("core/src/proxier.cpp") == (global > 7 ? global : 7));
  REQUIRE(klog::setVmodule({}));
  CHECK(klog::verbosityFor("core/src/proxier.cpp") == global);
}
