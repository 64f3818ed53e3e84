#include "kproxy/backends/common/process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>

extern char** environ;

namespace kproxy::backends {
namespace {

using core::ErrorCategory;
using core::makeError;
using Clock = std::chrono::steady_clock;

/// Closes on scope exit; -1 means nothing held.
class FileDescriptor {
 public:
  FileDescriptor() = default;
  explicit FileDescriptor(int fd) : fd_(fd) {}
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  ~FileDescriptor() { reset(); }
  int get() const { return fd_; }
  void reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

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

int waitForChild(pid_t pid, int& status) {
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return errno;
  }
  return 0;
}

std::string commandName(const std::vector<std::string>& argv) { return argv.front(); }

}  // namespace

core::Result<ProcessResult> runProcess(const std::vector<std::string>& argv, const ProcessOptions& options) {
  if (argv.empty() || argv.front().empty()) return makeError(ErrorCategory::kInvalidArgument, "empty command");

  // stdin is a socket, not a pipe: send(MSG_NOSIGNAL) to a child that stopped reading gets
  // EPIPE instead of raising SIGPIPE, with no signal handler touched.
  int stdinPair[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, stdinPair) != 0)
    return makeError(ErrorCategory::kProcess, "socketpair for " + commandName(argv), errno);
  FileDescriptor stdinOurs(stdinPair[0]), stdinChild(stdinPair[1]);
  int outPipe[2];
  if (::pipe2(outPipe, O_CLOEXEC) != 0) return makeError(ErrorCategory::kProcess, "pipe for " + commandName(argv), errno);
  FileDescriptor outOurs(outPipe[0]), outChild(outPipe[1]);
  int errPipe[2];
  if (::pipe2(errPipe, O_CLOEXEC) != 0) return makeError(ErrorCategory::kProcess, "pipe for " + commandName(argv), errno);
  FileDescriptor errOurs(errPipe[0]), errChild(errPipe[1]);

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
  if (spawned != 0) return makeError(ErrorCategory::kProcess, "could not run " + commandName(argv), spawned);
  stdinChild.reset();
  outChild.reset();
  errChild.reset();

  const bool hasDeadline = options.timeout.has_value();
  const Clock::time_point deadline = hasDeadline ? Clock::now() + *options.timeout : Clock::time_point::max();
  ProcessResult result;
  std::string_view input = options.stdinData;
  if (input.empty()) stdinOurs.reset();
  // Readable once the child has exited, so that a child which closes its output early still
  // meets the timeout. Without pidfds (Linux < 5.3) only the output is watched.
  FileDescriptor childExit;
#ifdef SYS_pidfd_open
  if (hasDeadline) childExit.reset(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
#endif
  bool timedOut = false;
  int ioError = 0;
  while (outOurs.get() >= 0 || errOurs.get() >= 0 || childExit.get() >= 0) {
    pollfd fds[4];
    nfds_t count = 0;
    if (stdinOurs.get() >= 0) fds[count++] = {stdinOurs.get(), POLLOUT, 0};
    if (childExit.get() >= 0) fds[count++] = {childExit.get(), POLLIN, 0};
    if (outOurs.get() >= 0) fds[count++] = {outOurs.get(), POLLIN, 0};
    if (errOurs.get() >= 0) fds[count++] = {errOurs.get(), POLLIN, 0};
    int waitMs = -1;
    if (hasDeadline) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) {
        timedOut = true;
        break;
      }
      waitMs = left > INT_MAX ? INT_MAX : static_cast<int>(left);
    }
    const int ready = ::poll(fds, count, waitMs);
    if (ready < 0) {
      if (errno == EINTR) continue;
      ioError = errno;
      break;
    }
    for (nfds_t i = 0; i < count; ++i) {
      if (fds[i].revents == 0) continue;
      if (fds[i].fd == stdinOurs.get()) {
        const ssize_t n = ::send(stdinOurs.get(), input.data(), input.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) input.remove_prefix(static_cast<std::size_t>(n));
        // EPIPE: the child closed its stdin; what it did not read is its business.
        if ((n < 0 && errno != EINTR && errno != EAGAIN) || input.empty()) stdinOurs.reset();
        continue;
      }
      if (fds[i].fd == childExit.get()) {
        childExit.reset();
        continue;
      }
      FileDescriptor& source = fds[i].fd == outOurs.get() ? outOurs : errOurs;
      char buffer[65536];
      const ssize_t n = ::read(source.get(), buffer, sizeof buffer);
      if (n > 0) {
        (&source == &outOurs ? result.out : result.err).append(buffer, static_cast<std::size_t>(n));
      } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
        source.reset();
      }
    }
  }
  stdinOurs.reset();
  childExit.reset();
  if (timedOut || ioError != 0) ::kill(pid, SIGKILL);
  outOurs.reset();
  errOurs.reset();

  int status = 0;
  if (int e = waitForChild(pid, status); e != 0)
    return makeError(ErrorCategory::kProcess, "waiting for " + commandName(argv), e);
  if (timedOut) {
    return makeError(ErrorCategory::kProcess,
                     "killed " + commandName(argv) + " after " + std::to_string(options.timeout->count()) + "ms",
                     ETIMEDOUT);
  }
  if (ioError != 0) return makeError(ErrorCategory::kProcess, "reading output of " + commandName(argv), ioError);
  if (WIFEXITED(status)) {
    result.exitCode = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    result.termSignal = WTERMSIG(status);
    result.exitCode = 128 + result.termSignal;
  }
  return result;
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

}  // namespace kproxy::backends
