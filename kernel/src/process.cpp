#include "kproxy/kernel/process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>

#include "kproxy/kernel/file_descriptor.h"

extern char** environ;

namespace kproxy::kernel {
namespace {

using core::ErrorCategory;
using core::makeError;
using Clock = std::chrono::steady_clock;

/// The posix_spawn attribute and file action objects, destroyed on scope exit.
struct SpawnSetup {
  posix_spawn_file_actions_t actions{};
  posix_spawnattr_t attributes{};
  SpawnSetup() {
    posix_spawn_file_actions_init(&actions);
    posix_spawnattr_init(&attributes);
  }
  SpawnSetup(const SpawnSetup&) = delete;
  SpawnSetup& operator=(const SpawnSetup&) = delete;
  ~SpawnSetup() {
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attributes);
  }
};

int waitForChild(pid_t pid, int& status, rusage* usage = nullptr) {
  while (::wait4(pid, &status, 0, usage) < 0) {
    if (errno != EINTR) return errno;
  }
  return 0;
}

std::chrono::microseconds toMicroseconds(const timeval& t) {
  return std::chrono::seconds(t.tv_sec) + std::chrono::microseconds(t.tv_usec);
}

std::string commandName(const std::vector<std::string>& argv) { return argv.front(); }

/// A spawned child and our ends of its stdin, stdout and stderr.
class ChildProcess final : public ProcessStream {
 public:
  ~ChildProcess() override {
    if (pid_ > 0) {
      // Never finished (the caller gave up): kill and reap, so no zombie is left behind.
      ::kill(pid_, SIGKILL);
      int status = 0;
      waitForChild(pid_, status);
    }
  }

  core::Result<void> spawn(const std::vector<std::string>& argv, const ProcessOptions& options);

  core::Result<void> write(std::string_view data) override {
    if (data.empty() || stdinOurs_.get() < 0) return {};
    pump(data);
    return failure();
  }

  void closeInput() override { stdinOurs_.reset(); }

  core::Result<ProcessResult> finish() override {
    stdinOurs_.reset();
    if (!timedOut_ && ioError_ == 0) pump({});
    childExit_.reset();
    if (timedOut_ || ioError_ != 0) ::kill(pid_, SIGKILL);
    outOurs_.reset();
    errOurs_.reset();
    int status = 0;
    rusage usage{};
    const int e = waitForChild(pid_, status, &usage);
    pid_ = -1;
    if (e != 0) return makeError(ErrorCategory::kProcess, "waiting for " + name_, e);
    if (auto f = failure(); !f) return std::unexpected(f.error());
    if (WIFEXITED(status)) {
      result_.exitCode = WEXITSTATUS(status);
    } else if (WIFSIGNALED(status)) {
      result_.termSignal = WTERMSIG(status);
      result_.exitCode = 128 + result_.termSignal;
    }
    result_.userTime = toMicroseconds(usage.ru_utime);
    result_.systemTime = toMicroseconds(usage.ru_stime);
    return std::move(result_);
  }

 private:
  core::Result<void> failure() const {
    if (timedOut_)
      return makeError(ErrorCategory::kProcess, "killed " + name_ + " after " + std::to_string(timeout_->count()) + "ms",
                       ETIMEDOUT);
    if (ioError_ != 0) return makeError(ErrorCategory::kProcess, "reading output of " + name_, ioError_);
    return {};
  }

  /// Writes `input` (while stdin is open) and reads the output meanwhile. With input, returns
  /// once it is written or stdin closed; without, once the output is closed and the child
  /// has exited (or the timeout passed, or the pipes failed).
  void pump(std::string_view input) {
    const bool writing = !input.empty();
    while (outOurs_.get() >= 0 || errOurs_.get() >= 0 || childExit_.get() >= 0) {
      if (writing && (input.empty() || stdinOurs_.get() < 0)) return;
      pollfd fds[4];
      nfds_t count = 0;
      if (writing) fds[count++] = {stdinOurs_.get(), POLLOUT, 0};
      if (childExit_.get() >= 0) fds[count++] = {childExit_.get(), POLLIN, 0};
      if (outOurs_.get() >= 0) fds[count++] = {outOurs_.get(), POLLIN, 0};
      if (errOurs_.get() >= 0) fds[count++] = {errOurs_.get(), POLLIN, 0};
      int waitMs = -1;
      if (timeout_) {
        const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline_ - Clock::now()).count();
        if (left <= 0) {
          timedOut_ = true;
          return;
        }
        waitMs = left > INT_MAX ? INT_MAX : static_cast<int>(left);
      }
      const int ready = ::poll(fds, count, waitMs);
      if (ready < 0) {
        if (errno == EINTR) continue;
        ioError_ = errno;
        return;
      }
      for (nfds_t i = 0; i < count; ++i) {
        if (fds[i].revents == 0) continue;
        if (writing && fds[i].fd == stdinOurs_.get()) {
          const ssize_t n = ::send(stdinOurs_.get(), input.data(), input.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
          if (n > 0) input.remove_prefix(static_cast<std::size_t>(n));
          // EPIPE: the child closed its stdin; what it did not read is its business.
          if (n < 0 && errno != EINTR && errno != EAGAIN) stdinOurs_.reset();
          continue;
        }
        if (fds[i].fd == childExit_.get()) {
          childExit_.reset();
          continue;
        }
        FileDescriptor& source = fds[i].fd == outOurs_.get() ? outOurs_ : errOurs_;
        char buffer[65536];
        const ssize_t n = ::read(source.get(), buffer, sizeof buffer);
        if (n > 0) {
          if (&source == &outOurs_ && onOutput_)
            onOutput_(std::string_view(buffer, static_cast<std::size_t>(n)));
          else
            (&source == &outOurs_ ? result_.out : result_.err).append(buffer, static_cast<std::size_t>(n));
        } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
          source.reset();
        }
      }
    }
  }

  std::string name_;
  pid_t pid_ = -1;
  FileDescriptor stdinOurs_, outOurs_, errOurs_, childExit_;
  std::optional<std::chrono::milliseconds> timeout_;
  std::function<void(std::string_view)> onOutput_;
  Clock::time_point deadline_ = Clock::time_point::max();
  ProcessResult result_;
  bool timedOut_ = false;
  int ioError_ = 0;
};

core::Result<void> ChildProcess::spawn(const std::vector<std::string>& argv, const ProcessOptions& options) {
  if (argv.empty() || argv.front().empty()) return makeError(ErrorCategory::kInvalidArgument, "empty command");
  name_ = commandName(argv);

  // stdin is a socket, not a pipe: send(MSG_NOSIGNAL) to a child that stopped reading gets
  // EPIPE instead of raising SIGPIPE, with no signal handler touched.
  int stdinPair[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, stdinPair) != 0)
    return makeError(ErrorCategory::kProcess, "socketpair for " + name_, errno);
  stdinOurs_.reset(stdinPair[0]);
  FileDescriptor stdinChild(stdinPair[1]);
  int outPipe[2];
  if (::pipe2(outPipe, O_CLOEXEC) != 0) return makeError(ErrorCategory::kProcess, "pipe for " + name_, errno);
  outOurs_.reset(outPipe[0]);
  FileDescriptor outChild(outPipe[1]);
  int errPipe[2];
  if (::pipe2(errPipe, O_CLOEXEC) != 0) return makeError(ErrorCategory::kProcess, "pipe for " + name_, errno);
  errOurs_.reset(errPipe[0]);
  FileDescriptor errChild(errPipe[1]);

  SpawnSetup setup;
  // dup2 clears close-on-exec on the target, so the child keeps exactly 0, 1 and 2.
  posix_spawn_file_actions_adddup2(&setup.actions, stdinChild.get(), 0);
  posix_spawn_file_actions_adddup2(&setup.actions, outChild.get(), 1);
  posix_spawn_file_actions_adddup2(&setup.actions, errChild.get(), 2);
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 34))
  // Descriptors other code opened without close-on-exec must not leak into the child either.
  posix_spawn_file_actions_addclosefrom_np(&setup.actions, 3);
#endif
  // The caller may ignore or block signals (SIGPIPE, or signals it reads with signalfd); the
  // child must not inherit that.
  sigset_t all, none;
  sigfillset(&all);
  sigemptyset(&none);
  posix_spawnattr_setsigdefault(&setup.attributes, &all);
  posix_spawnattr_setsigmask(&setup.attributes, &none);
  posix_spawnattr_setflags(&setup.attributes, POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);

  std::vector<char*> args;
  args.reserve(argv.size() + 1);
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);

  pid_t pid = -1;
  const bool hasPath = argv.front().find('/') != std::string::npos;
  const int spawned = hasPath ? posix_spawn(&pid, args[0], &setup.actions, &setup.attributes, args.data(), environ)
                              : posix_spawnp(&pid, args[0], &setup.actions, &setup.attributes, args.data(), environ);
  if (spawned != 0) return makeError(ErrorCategory::kProcess, "could not run " + name_, spawned);
  pid_ = pid;
  stdinChild.reset();
  outChild.reset();
  errChild.reset();

  timeout_ = options.timeout;
  onOutput_ = options.onOutput;
  if (timeout_) deadline_ = Clock::now() + *timeout_;
  // Readable once the child has exited, so that a child which closes its output early still
  // meets the timeout. Without pidfds (Linux < 5.3) only the output is watched.
#ifdef SYS_pidfd_open
  if (timeout_) childExit_.reset(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
#endif
  return write(options.stdinData);
}

}  // namespace

core::Result<std::unique_ptr<ProcessStream>> startProcess(const std::vector<std::string>& argv,
                                                          const ProcessOptions& options) {
  auto child = std::make_unique<ChildProcess>();
  if (auto r = child->spawn(argv, options); !r) return std::unexpected(r.error());
  return child;
}

core::Result<ProcessResult> runProcess(const std::vector<std::string>& argv, const ProcessOptions& options) {
  auto child = startProcess(argv, options);
  if (!child) return std::unexpected(child.error());
  return (*child)->finish();
}

namespace {

/// ProcessRunner::start's default: the input is collected and the child run in finish().
class CollectedInput final : public ProcessStream {
 public:
  CollectedInput(ProcessRunner& runner, std::vector<std::string> argv, const ProcessOptions& options)
      : runner_(runner), argv_(std::move(argv)), input_(options.stdinData), timeout_(options.timeout) {}
  core::Result<void> write(std::string_view data) override {
    input_ += data;
    return {};
  }
  void closeInput() override {}
  core::Result<ProcessResult> finish() override { return runner_.run(argv_, ProcessOptions{input_, timeout_}); }

 private:
  ProcessRunner& runner_;
  std::vector<std::string> argv_;
  std::string input_;
  std::optional<std::chrono::milliseconds> timeout_;
};

}  // namespace

core::Result<std::unique_ptr<ProcessStream>> ProcessRunner::start(const std::vector<std::string>& argv,
                                                                  const ProcessOptions& options) {
  return std::make_unique<CollectedInput>(*this, argv, options);
}

std::optional<std::string> findExecutable(std::string_view name) {
  if (name.empty()) return std::nullopt;
  if (name.find('/') != std::string_view::npos) {
    std::string path(name);
    if (::access(path.c_str(), X_OK) == 0) return path;
    return std::nullopt;
  }
  std::vector<std::string> dirs;
  if (const char* path = std::getenv("PATH")) {
    std::string_view rest(path);
    while (!rest.empty()) {
      const auto colon = rest.find(':');
      dirs.emplace_back(rest.substr(0, colon));
      rest = colon == std::string_view::npos ? std::string_view{} : rest.substr(colon + 1);
    }
  }
  for (const char* dir : {"/usr/local/sbin", "/usr/sbin", "/sbin", "/usr/bin", "/bin"}) dirs.emplace_back(dir);
  for (const auto& dir : dirs) {
    if (dir.empty()) continue;
    std::string candidate = dir + "/" + std::string(name);
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return std::nullopt;
}

}  // namespace kproxy::kernel
