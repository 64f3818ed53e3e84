#pragma once
/// Running a program and collecting its output, without a shell: for iptables-save/-restore,
/// ipvsadm, ipset, ip. The caller's process-wide state is left alone: no signal handler is
/// installed or changed (a child that stops reading its input cannot raise SIGPIPE here), the
/// child starts with default signal dispositions and an empty signal mask, and it inherits only
/// stdin, stdout and stderr.
/// Thread-safety: runProcess and findExecutable may be called from any thread; a
/// ProcessRunner is as thread-safe as its implementation says (SystemProcessRunner is).

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kproxy/core/error.h"

namespace kproxy::kernel {

struct ProcessOptions {
  /// Written to the child's stdin, which is then closed (empty: stdin is closed at once).
  std::string_view stdinData;
  /// The child is killed (SIGKILL) once this has passed; nullopt waits for ever.
  std::optional<std::chrono::milliseconds> timeout;
  /// When set, stdout is handed to it piece by piece as it is read, and ProcessResult::out
  /// stays empty (a runner that cannot stream may still fill `out` instead).
  std::function<void(std::string_view)> onOutput = {};
};

struct ProcessResult {
  int exitCode = 0;    ///< exit status; 128 + signal when killed by a signal
  int termSignal = 0;  ///< the signal that ended it, 0 when it exited
  std::string out;     ///< stdout
  std::string err;     ///< stderr
  /// CPU time the child used in user space and in the kernel (its own, from wait4(2)); for a
  /// tool that talks netlink, `systemTime` is mostly the kernel applying what it sent.
  std::chrono::microseconds userTime{0};
  std::chrono::microseconds systemTime{0};
  bool succeeded() const { return termSignal == 0 && exitCode == 0; }
};

/// Runs argv[0] (a path when it holds '/', else looked up in PATH) with argv as its arguments
/// and waits for it. Error (category kProcess) when it cannot start (errno ENOENT, EACCES, ...),
/// when it outlives `timeout` (errno ETIMEDOUT; the child has then been killed and reaped), or
/// when the pipes fail; a program that runs and fails is a result with its exit code.
core::Result<ProcessResult> runProcess(const std::vector<std::string>& argv, const ProcessOptions& options = {});

/// A running child whose stdin is written piece by piece: input produced while the child
/// already reads it (a restore input rendered while iptables-restore parses its start). The
/// child's output is read while writing, so a chatty child cannot block it.
/// Thread-safety: one thread at a time.
class ProcessStream {
 public:
  virtual ~ProcessStream() = default;
  /// Writes `data` to the child's stdin; returns once the child has taken all of it, or has
  /// closed its stdin (what it did not read is its business, as with ProcessOptions::stdinData).
  /// Error (kProcess) when the timeout passed (the child is then killed) or the pipes fail.
  virtual core::Result<void> write(std::string_view data) = 0;
  /// Closes stdin without waiting: the child goes on with what it has while the caller does
  /// something else (its output is read in finish(); a child that writes more than a pipe holds
  /// before then waits). No-op when stdin is closed already.
  virtual void closeInput() = 0;
  /// Closes stdin and waits for the child, as runProcess does. Call once.
  virtual core::Result<ProcessResult> finish() = 0;
};

/// Starts argv as runProcess does, with stdin left open for ProcessStream::write;
/// `options.stdinData` is written first. The timeout counts from the start.
core::Result<std::unique_ptr<ProcessStream>> startProcess(const std::vector<std::string>& argv,
                                                          const ProcessOptions& options = {});

/// The full path of an executable `name` in PATH or the sbin and bin directories (root's tools
/// are in sbin, which a non-login PATH may lack); nullopt when there is none.
std::optional<std::string> findExecutable(std::string_view name);

/// Runs programs; backends take one so tests can substitute a fake.
class ProcessRunner {
 public:
  virtual ~ProcessRunner() = default;
  virtual core::Result<ProcessResult> run(const std::vector<std::string>& argv, const ProcessOptions& options) = 0;
  /// Starts a child fed piece by piece. The default collects what is written and runs the
  /// child with all of it in finish() (enough for fakes; nothing overlaps).
  virtual core::Result<std::unique_ptr<ProcessStream>> start(const std::vector<std::string>& argv,
                                                             const ProcessOptions& options);
};

/// The real runner: runProcess.
class SystemProcessRunner final : public ProcessRunner {
 public:
  core::Result<ProcessResult> run(const std::vector<std::string>& argv, const ProcessOptions& options) override {
    return runProcess(argv, options);
  }
  core::Result<std::unique_ptr<ProcessStream>> start(const std::vector<std::string>& argv,
                                                     const ProcessOptions& options) override {
    return startProcess(argv, options);
  }
};

}  // namespace kproxy::kernel
