// kproxy-netprobe: the two socket questions the data-path tests ask that curl cannot answer
// exactly, for IPv4 and IPv6, with nothing beyond libc (it also runs in the test VM):
//
//   kproxy-netprobe connect ADDRESS PORT [SECONDS]
//       one TCP connect; prints how it ended: OK, or the errno's name (ECONNREFUSED,
//       EHOSTUNREACH, ...), ETIMEDOUT when nothing answered within SECONDS (default 2).
//       curl's message for a refused connection varies between versions; the errno does not.
//   kproxy-netprobe udp ADDRESS PORT MESSAGE [SECONDS]
//       sends MESSAGE as one datagram and prints the first reply without its trailing newline;
//       exit 1 when none came within SECONDS (default 2).
//
// Exit status 2 on a bad command line.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

namespace {

[[noreturn]] void usage() {
  std::fputs(
      "usage: kproxy-netprobe connect ADDRESS PORT [SECONDS]\n"
      "       kproxy-netprobe udp ADDRESS PORT MESSAGE [SECONDS]\n",
      stderr);
  std::exit(2);
}

struct Target {
  sockaddr_storage address{};
  socklen_t length = 0;
};

Target parseTarget(const char* address, const char* portText) {
  char* end = nullptr;
  long port = std::strtol(portText, &end, 10);
  if (*portText == '\0' || *end != '\0' || port < 1 || port > 65535) usage();
  Target target;
  auto& in = reinterpret_cast<sockaddr_in&>(target.address);
  auto& in6 = reinterpret_cast<sockaddr_in6&>(target.address);
  if (inet_pton(AF_INET, address, &in.sin_addr) == 1) {
    in.sin_family = AF_INET;
    in.sin_port = htons(static_cast<std::uint16_t>(port));
    target.length = sizeof in;
  } else if (inet_pton(AF_INET6, address, &in6.sin6_addr) == 1) {
    in6.sin6_family = AF_INET6;
    in6.sin6_port = htons(static_cast<std::uint16_t>(port));
    target.length = sizeof in6;
  } else {
    std::fprintf(stderr, "kproxy-netprobe: not an IP address: %s\n", address);
    usage();
  }
  return target;
}

int parseMillis(const char* seconds) {
  if (seconds == nullptr) return 2000;
  char* end = nullptr;
  double value = std::strtod(seconds, &end);
  if (*seconds == '\0' || *end != '\0' || !(value > 0) || value > 3600) usage();
  return static_cast<int>(value * 1000);
}

// The errno's symbolic name (ECONNREFUSED), which glibc knows for every errno it defines.
std::string errnoName(int error) {
  const char* name = strerrorname_np(error);
  return name != nullptr ? name : std::to_string(error);
}

int probeConnect(const Target& target, int millis) {
  int fd = ::socket(target.address.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    std::printf("%s\n", errnoName(errno).c_str());
    return 0;
  }
  std::string result = "OK";
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&target.address), target.length) != 0) {
    if (errno != EINPROGRESS) {
      result = errnoName(errno);
    } else {
      pollfd p{.fd = fd, .events = POLLOUT, .revents = 0};
      int ready;
      do ready = ::poll(&p, 1, millis);
      while (ready < 0 && errno == EINTR);
      if (ready == 0) {
        result = "ETIMEDOUT";
      } else {
        int error = 0;
        socklen_t length = sizeof error;
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length);
        if (error != 0) result = errnoName(error);
      }
    }
  }
  ::close(fd);
  std::printf("%s\n", result.c_str());
  return 0;
}

int probeUdp(const Target& target, std::string_view message, int millis) {
  int fd = ::socket(target.address.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  const auto* address = reinterpret_cast<const sockaddr*>(&target.address);
  if (fd < 0 || ::connect(fd, address, target.length) != 0 ||
      ::send(fd, message.data(), message.size(), 0) < 0) {
    std::fprintf(stderr, "kproxy-netprobe: udp: %s\n", std::strerror(errno));
    return 1;
  }
  pollfd p{.fd = fd, .events = POLLIN, .revents = 0};
  if (::poll(&p, 1, millis) <= 0) {
    std::fprintf(stderr, "kproxy-netprobe: udp: no reply within %d ms\n", millis);
    return 1;
  }
  char reply[65536];
  ssize_t n = ::recv(fd, reply, sizeof reply, 0);
  if (n < 0) {
    // A refusal (ICMP port unreachable) comes back as the receive's error.
    std::fprintf(stderr, "kproxy-netprobe: udp: %s\n", errnoName(errno).c_str());
    return 1;
  }
  std::string_view text(reply, static_cast<std::size_t>(n));
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.remove_suffix(1);
  std::printf("%.*s\n", static_cast<int>(text.size()), text.data());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) usage();
  std::string_view command = argv[1];
  if (command == "connect" && (argc == 4 || argc == 5)) {
    return probeConnect(parseTarget(argv[2], argv[3]), parseMillis(argc == 5 ? argv[4] : nullptr));
  }
  if (command == "udp" && (argc == 5 || argc == 6)) {
    return probeUdp(parseTarget(argv[2], argv[3]), argv[4],
                    parseMillis(argc == 6 ? argv[5] : nullptr));
  }
  usage();
}
