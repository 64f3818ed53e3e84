#include <catch2/catch.hpp>

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
