#include "duration.h"

#include <catch2/catch.hpp>

using kproxy::cli::Duration;
using kproxy::cli::formatGoDuration;
using kproxy::cli::parseGoDuration;
using namespace std::chrono_literals;

TEST_CASE("parseGoDuration accepts Go syntax", "[unit]") {
  CHECK(parseGoDuration("30s").value() == Duration(30s));
  CHECK(parseGoDuration("1m30s").value() == Duration(90s));
  CHECK(parseGoDuration("500ms").value() == Duration(500ms));
  CHECK(parseGoDuration("2h").value() == Duration(2h));
  CHECK(parseGoDuration("2h45m").value() == Duration(2h + 45min));
  CHECK(parseGoDuration("0").value() == Duration(0));
  CHECK(parseGoDuration("0s").value() == Duration(0));
  CHECK(parseGoDuration("1.5s").value() == Duration(1500ms));
  CHECK(parseGoDuration(".5s").value() == Duration(500ms));
  CHECK(parseGoDuration("1.5h").value() == Duration(90min));
  CHECK(parseGoDuration("10us").value() == Duration(10us));
  CHECK(parseGoDuration("10\xC2\xB5s").value() == Duration(10us));
  CHECK(parseGoDuration("7ns").value() == Duration(7ns));
  CHECK(parseGoDuration("-5s").value() == Duration(-5s));
  CHECK(parseGoDuration("+5s").value() == Duration(5s));
  CHECK(parseGoDuration("1h1m1s1ms1us1ns").value() ==
        Duration(1h + 1min + 1s + 1ms + 1us + 1ns));
}

TEST_CASE("parseGoDuration rejects malformed input with a reason", "[unit]") {
  for (const char* bad : {"", "30", "s", "1x", "1.s.", "-", "1h30", "abc", "1 s", "1e3s", "--1s"}) {
    INFO(bad);
    auto r = parseGoDuration(bad);
    REQUIRE_FALSE(r.has_value());
    CHECK_FALSE(r.error().context.empty());
  }
  CHECK(parseGoDuration("30").error().context.find("missing unit") != std::string::npos);
  CHECK(parseGoDuration("3x").error().context.find("unknown unit") != std::string::npos);
  CHECK(parseGoDuration("9999999999999999999h").error().context.find("out of range") !=
        std::string::npos);
  CHECK(parseGoDuration("3000000h").error().context.find("out of range") != std::string::npos);
}

TEST_CASE("formatGoDuration matches Go's Duration.String", "[unit]") {
  CHECK(formatGoDuration(Duration(0)) == "0s");
  CHECK(formatGoDuration(30s) == "30s");
  CHECK(formatGoDuration(90s) == "1m30s");
  CHECK(formatGoDuration(1h) == "1h0m0s");
  CHECK(formatGoDuration(24h) == "24h0m0s");
  CHECK(formatGoDuration(15min) == "15m0s");
  CHECK(formatGoDuration(500ms) == "500ms");
  CHECK(formatGoDuration(1500ms) == "1.5s");
  CHECK(formatGoDuration(250us) == "250\xC2\xB5s");
  CHECK(formatGoDuration(1500us) == "1.5ms");
  CHECK(formatGoDuration(7ns) == "7ns");
  CHECK(formatGoDuration(-90s) == "-1m30s");
  CHECK(formatGoDuration(Duration(std::numeric_limits<std::int64_t>::min())) ==
        "-2562047h47m16.854775808s");
}

TEST_CASE("formatGoDuration output parses back to the same value", "[unit]") {
  for (Duration d : {Duration(0), Duration(1), Duration(999), Duration(1001), Duration(123456789),
                     Duration(30s), Duration(90s + 5ms), Duration(24h), Duration(-7h - 3ns),
                     Duration(std::numeric_limits<std::int64_t>::max()),
                     Duration(std::numeric_limits<std::int64_t>::min())}) {
    INFO(formatGoDuration(d));
    CHECK(parseGoDuration(formatGoDuration(d)).value() == d);
  }
}
