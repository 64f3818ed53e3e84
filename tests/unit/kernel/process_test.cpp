#include "kproxy/kernel/process.h"

#include <signal.h>

#include <catch2/catch.hpp>

#include <cerrno>
#include <chrono>

using namespace kproxy::kernel;
using namespace std::chrono_literals;

namespace {

/// How long a test waits for a child before it takes it for a hang: a ceiling, never a measure
/// (the machine may be slow, loaded, or running sanitizers).
constexpr auto kHang = 60s;
/// sleep(1)'s argument for a child that must be killed: twice kHang.
constexpr const char* kSleepPastHang = "120";

}  // namespace

TEST_CASE("exit codes come back as results", "[unit]") {
  auto ok = runProcess({"true"});
  REQUIRE(ok);
  CHECK(ok->exitCode == 0);
  CHECK(ok->succeeded());
  auto failed = runProcess({"false"});
  REQUIRE(failed);
  CHECK(failed->exitCode == 1);
  CHECK_FALSE(failed->succeeded());
  auto three = runProcess({"sh", "-c", "echo out; echo err >&2; exit 3"});
  REQUIRE(three);
  CHECK(three->exitCode == 3);
  CHECK(three->out == "out\n");
  CHECK(three->err == "err\n");
}

TEST_CASE("a child killed by a signal reports the signal", "[unit]") {
  auto killed = runProcess({"sh", "-c", "kill -TERM $$"});
  REQUIRE(killed);
  CHECK(killed->termSignal == SIGTERM);
  CHECK(killed->exitCode == 128 + SIGTERM);
}

TEST_CASE("arguments are passed as they are, without a shell", "[unit]") {
  auto echoed = runProcess({"printf", "%s|", "a b", "$HOME", "*"});
  REQUIRE(echoed);
  CHECK(echoed->out == "a b|$HOME|*|");
}

TEST_CASE("stdin is piped through", "[unit]") {
  auto cat = runProcess({"cat"}, {.stdinData = "line 1\nline 2\n", .timeout = std::nullopt});
  REQUIRE(cat);
  CHECK(cat->exitCode == 0);
  CHECK(cat->out == "line 1\nline 2\n");
  // No input: stdin is closed, so cat ends at once.
  auto empty = runProcess({"cat"}, {.stdinData = {}, .timeout = 5s});
  REQUIRE(empty);
  CHECK(empty->out.empty());
}

TEST_CASE("large input and output do not deadlock", "[unit]") {
  auto big = runProcess({"head", "-c", "1048576", "/dev/zero"});
  REQUIRE(big);
  CHECK(big->exitCode == 0);
  CHECK(big->out.size() == 1048576);
  // Input and output of a MiB at once: the runner must write and read together.
  const std::string input(1 << 20, 'x');
  auto through = runProcess({"cat"}, {.stdinData = input, .timeout = 20s});
  REQUIRE(through);
  CHECK(through->out == input);
}

TEST_CASE("stdout can be taken piece by piece instead of collected", "[unit]") {
  // Four MiB through a pipe arrive in many reads; each is handed over as it comes, none kept.
  std::string seen;
  std::size_t pieces = 0;
  auto streamed = runProcess({"sh", "-c", "head -c 4194304 /dev/zero | tr '\\0' y; echo err >&2"},
                             {.stdinData = {}, .timeout = 20s, .onOutput = [&](std::string_view piece) {
                                seen.append(piece);
                                ++pieces;
                              }});
  REQUIRE(streamed);
  CHECK(streamed->succeeded());
  CHECK(streamed->out.empty());
  CHECK(streamed->err == "err\n");  // stderr is still collected
  CHECK(seen.size() == 4194304);
  CHECK(seen.find_first_not_of('y') == std::string::npos);
  CHECK(pieces > 1);
}

TEST_CASE("the child's own CPU time comes back with its result", "[unit]") {
  auto busy = runProcess({"sh", "-c", "i=0; while [ $i -lt 300000 ]; do i=$((i + 1)); done"}, {.stdinData = {}, .timeout = 60s});
  REQUIRE(busy);
  CHECK(busy->succeeded());
  CHECK(busy->userTime + busy->systemTime >= 50ms);
  auto idle = runProcess({"sleep", "0.3"});
  REQUIRE(idle);
  CHECK(idle->userTime + idle->systemTime < 100ms);  // waiting is not CPU
}

TEST_CASE("a child that does not read its input does not kill the caller", "[unit]") {
  const std::string input(4 << 20, 'x');
  auto ignored = runProcess({"true"}, {.stdinData = input, .timeout = 20s});
  REQUIRE(ignored);
  CHECK(ignored->exitCode == 0);
}

// The children below would sleep twice kHang: a caller that waited for them instead of killing
// them at the timeout would take longer than kHang, a ceiling no loaded machine comes near.
TEST_CASE("the timeout kills the child", "[unit]") {
  const auto start = std::chrono::steady_clock::now();
  auto slept = runProcess({"sleep", kSleepPastHang}, {.stdinData = {}, .timeout = 200ms});
  const auto took = std::chrono::steady_clock::now() - start;
  REQUIRE_FALSE(slept);
  CHECK(slept.error().category == kproxy::core::ErrorCategory::kProcess);
  CHECK(slept.error().errnum == ETIMEDOUT);
  CHECK(took >= 200ms);
  CHECK(took < kHang);
  // A child that closed its output still meets the timeout.
  const auto start2 = std::chrono::steady_clock::now();
  auto quiet = runProcess({"sh", "-c", std::string("exec >&- 2>&-; sleep ") + kSleepPastHang},
                          {.stdinData = {}, .timeout = 200ms});
  CHECK_FALSE(quiet);
  CHECK(std::chrono::steady_clock::now() - start2 < kHang);
}

TEST_CASE("a missing program is a clear error", "[unit]") {
  auto missing = runProcess({"/nonexistent/kproxy-no-such-tool", "--version"});
  REQUIRE_FALSE(missing);
  CHECK(missing.error().category == kproxy::core::ErrorCategory::kProcess);
  CHECK(missing.error().errnum == ENOENT);
  CHECK(missing.error().message().find("/nonexistent/kproxy-no-such-tool") != std::string::npos);
  auto notInPath = runProcess({"kproxy-no-such-tool"});
  REQUIRE_FALSE(notInPath);
  CHECK(notInPath.error().errnum == ENOENT);
  CHECK_FALSE(runProcess({}));
}

TEST_CASE("the caller's SIGPIPE disposition is left alone", "[unit]") {
  struct sigaction before{};
  sigaction(SIGPIPE, nullptr, &before);
  REQUIRE(runProcess({"true"}, {.stdinData = "data", .timeout = std::nullopt}));
  struct sigaction after{};
  sigaction(SIGPIPE, nullptr, &after);
  CHECK(before.sa_handler == after.sa_handler);
}

TEST_CASE("executables are found in PATH and sbin", "[unit]") {
  auto sh = findExecutable("sh");
  REQUIRE(sh);
  CHECK(sh->ends_with("/sh"));
  CHECK(findExecutable(*sh) == sh);
  CHECK_FALSE(findExecutable("kproxy-no-such-tool"));
  CHECK_FALSE(findExecutable(""));
}

TEST_CASE("a started child reads its input piece by piece while it is written", "[unit]") {
  auto child = startProcess({"cat"}, {.stdinData = "first ", .timeout = 20s});
  REQUIRE(child);
  std::string expected = "first ";
  // More than the socket buffer, so writes wait for cat to read and its output to be drained.
  for (int i = 0; i < 64; ++i) {
    const std::string piece(64 << 10, static_cast<char>('a' + i % 26));
    REQUIRE((*child)->write(piece));
    expected += piece;
  }
  auto done = (*child)->finish();
  REQUIRE(done);
  CHECK(done->exitCode == 0);
  CHECK(done->out == expected);
}

TEST_CASE("a started child that exits early takes no more input and reports its status", "[unit]") {
  auto child = startProcess({"sh", "-c", "exit 3"}, {.stdinData = {}, .timeout = 20s});
  REQUIRE(child);
  const std::string piece(1 << 20, 'x');
  for (int i = 0; i < 8; ++i) REQUIRE((*child)->write(piece));
  auto done = (*child)->finish();
  REQUIRE(done);
  CHECK(done->exitCode == 3);
}

TEST_CASE("the timeout also bounds a write to a child that does not read", "[unit]") {
  const auto start = std::chrono::steady_clock::now();
  auto child = startProcess({"sleep", kSleepPastHang}, {.stdinData = {}, .timeout = 200ms});
  REQUIRE(child);
  auto wrote = (*child)->write(std::string(8 << 20, 'x'));
  REQUIRE_FALSE(wrote);
  CHECK(wrote.error().errnum == ETIMEDOUT);
  CHECK(std::chrono::steady_clock::now() - start < kHang);
  auto done = (*child)->finish();
  CHECK_FALSE(done);
}

TEST_CASE("a runner without its own start collects the input and runs the child once", "[unit]") {
  struct Recording final : ProcessRunner {
    std::vector<std::string> inputs;
    kproxy::core::Result<ProcessResult> run(const std::vector<std::string>&, const ProcessOptions& options) override {
      inputs.emplace_back(options.stdinData);
      return ProcessResult{};
    }
  } runner;
  auto child = runner.start({"anything"}, {.stdinData = "a", .timeout = 1s});
  REQUIRE(child);
  REQUIRE((*child)->write("b"));
  REQUIRE((*child)->write("c"));
  CHECK(runner.inputs.empty());
  REQUIRE((*child)->finish());
  REQUIRE(runner.inputs.size() == 1);
  CHECK(runner.inputs[0] == "abc");
}
