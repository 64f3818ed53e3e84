// Applying the logging options to the logger, and upstream's run-time verbosity setter.
#include "logging_setup.h"

#include <catch2/catch.hpp>

#include "kproxy/core/log.h"

using kproxy::cli::applyLogging;
using kproxy::cli::LoggingConfig;
using kproxy::cli::setVerbosityFromText;
namespace klog = kproxy::log;

namespace {
struct RestoreLogger {
  ~RestoreLogger() {
    klog::setVerbosity(0);
    klog::setFormat(klog::Format::kText);
    (void)klog::setVmodule({});
  }
};
}  // namespace

TEST_CASE("applyLogging sets the format, -v and --vmodule", "[unit]") {
  RestoreLogger restore;
  LoggingConfig logging;
  logging.verbosity = 3;
  logging.format = "json";
  logging.vmodule = {"proxier=6"};
  REQUIRE(applyLogging(logging));
  CHECK(klog::format() == klog::Format::kJson);
  CHECK(klog::verbosity() == 3);
  CHECK(klog::verbosityFor("core/src/proxier.cpp") == 6);
  CHECK(klog::verbosityFor("core/src/tracker.cpp") == 3);

  logging = LoggingConfig{};
  REQUIRE(applyLogging(logging));
  CHECK(klog::format() == klog::Format::kText);
  CHECK(klog::verbosity() == 0);
  CHECK(klog::verbosityFor("core/src/proxier.cpp") == 0);
}

TEST_CASE("setVerbosityFromText: GlogSetter's parsing and answers", "[unit]") {
  RestoreLogger restore;
  auto ok = setVerbosityFromText("4");
  REQUIRE(ok);
  CHECK(*ok == "successfully set klog.logging.verbosity to 4");
  CHECK(klog::verbosity() == 4);
  for (const char* bad : {"", "-1", "4\n", " 4", "x", "1.5", "99999999999"}) {
    CAPTURE(bad);
    auto refused = setVerbosityFromText(bad);
    CHECK_FALSE(refused);
    if (!refused) CHECK(refused.error().starts_with("strconv.ParseUint: parsing \""));
  }
  CHECK(klog::verbosity() == 4);  // a refused value changes nothing
  CHECK_FALSE(setVerbosityFromText("4294967295"));  // a uint32, but above klog's int32 level
}
