#pragma once
// Runs the current thread in a fresh network namespace for the lifetime of the guard, and back
// in the original one afterwards (the new namespace disappears with its last reference).
// Namespaces are per thread, so Catch2 assertions keep working in-process; processes forked
// from this thread (nft) inherit the new namespace. Never touches the root namespace's rules.

#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>

#include <catch2/catch.hpp>

namespace kproxy::testing {

class FreshNetns {
 public:
  FreshNetns() {
    if (geteuid() != 0)
      throw std::runtime_error("kernel tests need root (they create network namespaces)");
    saved_ = ::open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
    if (saved_ < 0) throw std::runtime_error(std::string("open netns: ") + std::strerror(errno));
    if (::unshare(CLONE_NEWNET) != 0) {
      ::close(saved_);
      throw std::runtime_error(std::string("unshare(CLONE_NEWNET): ") + std::strerror(errno));
    }
  }
  ~FreshNetns() {
    if (::setns(saved_, CLONE_NEWNET) != 0) std::perror("setns back to the original namespace");
    ::close(saved_);
  }
  FreshNetns(const FreshNetns&) = delete;
  FreshNetns& operator=(const FreshNetns&) = delete;

 private:
  int saved_ = -1;
};

/// Runs a shell command (in the current thread's namespace); returns {exit status, stdout}.
inline std::pair<int, std::string> run(const std::string& command) {
  std::string out;
  FILE* p = ::popen((command + " 2>&1").c_str(), "r");
  if (p == nullptr) return {-1, out};
  char buf[4096];
  std::size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  int status = ::pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

/// Runs a shell command (in the current thread's namespace) and requires it to succeed; its
/// output is reported when it does not.
inline void sh(const std::string& command) {
  auto [rc, out] = run(command);
  INFO(command << "\n" << out);
  REQUIRE(rc == 0);
}

}  // namespace kproxy::testing
