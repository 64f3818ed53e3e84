#include "config_watch.h"

#include <poll.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <thread>

namespace kproxy::cli {

struct ConfigFileWatcher::State {
  int fd = -1;
  std::jthread thread;
  ~State() {
    if (thread.joinable()) {
      thread.request_stop();
      thread.join();
    }
    if (fd >= 0) ::close(fd);
  }
};

ConfigFileWatcher::ConfigFileWatcher(std::unique_ptr<State> state) : state_(std::move(state)) {}
ConfigFileWatcher::~ConfigFileWatcher() = default;

core::Result<std::unique_ptr<ConfigFileWatcher>> ConfigFileWatcher::start(
    const std::string& path, std::function<void(const std::string&)> changed) {
  auto state = std::make_unique<State>();
  state->fd = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  if (state->fd < 0) return core::makeError(core::ErrorCategory::kIo, "inotify_init1", errno);
  if (::inotify_add_watch(state->fd, path.c_str(), IN_MODIFY | IN_MOVE_SELF) < 0)
    return core::makeError(core::ErrorCategory::kIo, "watching config file " + path, errno);
  const int fd = state->fd;
  state->thread = std::jthread([fd, changed = std::move(changed)](std::stop_token token) {
    std::array<char, 4096> buffer{};
    while (!token.stop_requested()) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 200) <= 0) continue;  // a tick to see the stop request
      const ssize_t n = ::read(fd, buffer.data(), buffer.size());
      for (ssize_t off = 0; off + static_cast<ssize_t>(sizeof(inotify_event)) <= n;) {
        const auto* event = reinterpret_cast<const inotify_event*>(buffer.data() + off);
        if ((event->mask & (IN_MODIFY | IN_MOVE_SELF)) != 0) {
          changed("content of the proxy server's configuration file was updated");
          return;
        }
        off += static_cast<ssize_t>(sizeof(inotify_event) + event->len);
      }
    }
  });
  return std::unique_ptr<ConfigFileWatcher>(new ConfigFileWatcher(std::move(state)));
}

}  // namespace kproxy::cli
