// kproxy-cluster-load: constant request load at a fixed rate, one line per request, for the
// cluster suite (tests/cluster/).
//
//   kproxy-cluster-load --target IP:PORT [--proto tcp|udp] [--rate N] [--timeout S] [--out FILE]
//
// Every request is a connection (TCP: "GET /", answered by the pod server with "pod=<name> ...")
// or a datagram from a socket (UDP: answered with "pod=<name> ...") of its own, so that each one
// meets the rules as they are when it is sent, never an established flow's conntrack entry.
// Requests leave every 1/N s (50 a second by default) whatever the earlier ones are doing; each
// gives up after --timeout seconds (3 by default, far above a normal answer's milliseconds).
// One line per request, written when it ends:
//
//   <send time, Unix seconds> <outcome> <detail> <latency ms>
//
// outcome: answered (detail: the pod's name), refused, reset, closed (the connection ended
// without an answer), timeout, error (detail: the errno's name). Runs until SIGTERM or SIGINT,
// then waits for the requests in flight (up to the timeout), writes "# done sent=N" and exits 0.
//
// One thread, nonblocking sockets and epoll: the send times stay on the schedule however many
// requests are in flight. Plain libc, as the other programs the namespaces run.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <optional>
#include <string>
#include <string_view>

namespace {

constexpr std::string_view kUsage =
    "usage: kproxy-cluster-load --target IP:PORT [--proto tcp|udp] [--rate N] [--timeout S] [--out FILE]\n";

volatile sig_atomic_t gStop = 0;
void onSignal(int) { gStop = 1; }

[[noreturn]] void usageError(const std::string& message) {
  std::fprintf(stderr, "%.*skproxy-cluster-load: error: %s\n", static_cast<int>(kUsage.size()), kUsage.data(),
               message.c_str());
  std::exit(2);
}

struct Options {
  sockaddr_in target{};
  bool udp = false;
  double rate = 50;
  double timeoutSeconds = 3;
  std::string out;
};

Options parseOptions(int argc, char** argv) {
  Options o;
  bool haveTarget = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 >= argc) usageError("missing value for " + arg);
    const std::string value = argv[++i];
    if (arg == "--target") {
      const auto colon = value.rfind(':');
      if (colon == std::string::npos) usageError("--target needs IP:PORT");
      o.target.sin_family = AF_INET;
      if (inet_pton(AF_INET, value.substr(0, colon).c_str(), &o.target.sin_addr) != 1) {
        usageError("--target: not an IPv4 address: " + value);
      }
      const int port = std::atoi(value.substr(colon + 1).c_str());
      if (port <= 0 || port > 65535) usageError("--target: bad port: " + value);
      o.target.sin_port = htons(static_cast<uint16_t>(port));
      haveTarget = true;
    } else if (arg == "--proto") {
      if (value != "tcp" && value != "udp") usageError("--proto is tcp or udp");
      o.udp = value == "udp";
    } else if (arg == "--rate") {
      o.rate = std::atof(value.c_str());
      if (!(o.rate > 0 && o.rate <= 10000)) usageError("--rate must be in (0, 10000]");
    } else if (arg == "--timeout") {
      o.timeoutSeconds = std::atof(value.c_str());
      if (!(o.timeoutSeconds > 0)) usageError("--timeout must be positive");
    } else if (arg == "--out") {
      o.out = value;
    } else {
      usageError("unknown argument " + arg);
    }
  }
  if (!haveTarget) usageError("--target is required");
  return o;
}

using Clock = std::chrono::steady_clock;

struct Request {
  double sentWall = 0;  // Unix seconds
  Clock::time_point sent;
  Clock::time_point deadline;
  bool connected = false;  // TCP: the request is written, the answer awaited
  std::string received;
};

double wallNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string errnoName(int err) {
  const char* name = strerrorname_np(err);
  if (name) return name;
  // std::to_string appended to a literal trips g++ 12's -Wrestrict at -O3 (a false positive).
  char buf[24];
  std::snprintf(buf, sizeof buf, "errno%d", err);
  return buf;
}

// The outcome an errno means for a request.
std::string outcomeOf(int err) {
  switch (err) {
    case ECONNREFUSED: return "refused -";
    case ECONNRESET:
    case EPIPE: return "reset -";
    case ETIMEDOUT: return "timeout -";
    default: return "error " + errnoName(err);
  }
}

// The pod's name in an answer ("pod=<name> client=..."), once the answer holds it whole.
std::optional<std::string> podOf(const std::string& received, bool udp) {
  std::string_view body = received;
  if (!udp) {
    const auto end = body.find("\r\n\r\n");
    if (end == std::string_view::npos) return std::nullopt;
    body.remove_prefix(end + 4);
  }
  const auto at = body.find("pod=");
  if (at == std::string_view::npos) return std::nullopt;
  const auto stop = body.find_first_of(" \n", at);
  if (stop == std::string_view::npos) return std::nullopt;
  return std::string(body.substr(at + 4, stop - at - 4));
}

class Load {
 public:
  explicit Load(Options o) : o_(std::move(o)) {}

  int run() {
    out_ = o_.out.empty() ? stdout : std::fopen(o_.out.c_str(), "a");
    if (!out_) {
      std::fprintf(stderr, "kproxy-cluster-load: cannot open %s: %s\n", o_.out.c_str(), std::strerror(errno));
      return 1;
    }
    epoll_ = epoll_create1(EPOLL_CLOEXEC);
    if (epoll_ < 0) {
      std::perror("kproxy-cluster-load: epoll_create1");
      return 1;
    }
    const auto period = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(1.0 / o_.rate));
    const auto timeout =
        std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o_.timeoutSeconds));
    Clock::time_point nextSend = Clock::now();
    long sent = 0;
    while (!gStop || !inFlight_.empty()) {
      const auto now = Clock::now();
      if (!gStop && now - nextSend > std::chrono::seconds(1)) {
        // This process did not run for over a second (the machine starved it): the sends it
        // owes are not made at once, which would be a burst the schedule never meant, but
        // counted as missed, on a line of their own, and the schedule goes on from now.
        const auto missed = (now - nextSend) / period;
        std::fprintf(out_, "# stall %.3f %.3f missed=%ld\n", wallNow(),
                     std::chrono::duration<double>(now - nextSend).count(), static_cast<long>(missed));
        std::fflush(out_);
        nextSend = now;
      }
      if (!gStop && now >= nextSend) {
        start(now, timeout);
        ++sent;
        nextSend += period;
        continue;
      }
      expire(now);
      Clock::time_point wakeAt = gStop ? now + std::chrono::milliseconds(100) : nextSend;
      for (const auto& [fd, r] : inFlight_) wakeAt = std::min(wakeAt, r.deadline);
      const auto waitMs = std::chrono::duration_cast<std::chrono::milliseconds>(wakeAt - now).count();
      epoll_event events[64];
      const int n = epoll_wait(epoll_, events, 64, static_cast<int>(std::max<long>(0, waitMs) + 1));
      if (n < 0 && errno != EINTR) {
        std::perror("kproxy-cluster-load: epoll_wait");
        return 1;
      }
      for (int i = 0; i < n; ++i) handle(events[i].data.fd, events[i].events);
    }
    std::fprintf(out_, "# done sent=%ld\n", sent);
    std::fflush(out_);
    return 0;
  }

 private:
  void start(Clock::time_point now, Clock::duration timeout) {
    Request r;
    r.sentWall = wallNow();
    r.sent = now;
    r.deadline = now + timeout;
    const int fd = socket(AF_INET, (o_.udp ? SOCK_DGRAM : SOCK_STREAM) | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      finish(r, "error " + errnoName(errno));
      return;
    }
    if (connect(fd, reinterpret_cast<const sockaddr*>(&o_.target), sizeof o_.target) != 0 && errno != EINPROGRESS) {
      const int err = errno;
      close(fd);
      finish(r, outcomeOf(err));
      return;
    }
    epoll_event ev{};
    ev.data.fd = fd;
    if (o_.udp) {
      if (send(fd, "ping\n", 5, 0) < 0) {
        const int err = errno;
        close(fd);
        finish(r, outcomeOf(err));
        return;
      }
      r.connected = true;
      ev.events = EPOLLIN;
    } else {
      ev.events = EPOLLOUT;
    }
    epoll_ctl(epoll_, EPOLL_CTL_ADD, fd, &ev);
    inFlight_.emplace(fd, std::move(r));
  }

  void handle(int fd, uint32_t events) {
    auto it = inFlight_.find(fd);
    if (it == inFlight_.end()) return;
    Request& r = it->second;
    if (!r.connected) {
      int err = 0;
      socklen_t len = sizeof err;
      getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      if (err != 0) return end(it, outcomeOf(err));
      static constexpr std::string_view kRequest = "GET / HTTP/1.1\r\nHost: cluster\r\nConnection: close\r\n\r\n";
      if (send(fd, kRequest.data(), kRequest.size(), MSG_NOSIGNAL) < 0) return end(it, outcomeOf(errno));
      r.connected = true;
      epoll_event ev{};
      ev.data.fd = fd;
      ev.events = EPOLLIN;
      epoll_ctl(epoll_, EPOLL_CTL_MOD, fd, &ev);
      return;
    }
    (void)events;
    char buf[2048];
    for (;;) {
      const ssize_t got = recv(fd, buf, sizeof buf, 0);
      if (got > 0) {
        r.received.append(buf, static_cast<size_t>(got));
        if (auto pod = podOf(r.received, o_.udp)) return end(it, "answered " + *pod);
        if (o_.udp) return end(it, "error bad-answer");
        continue;
      }
      if (got == 0) return end(it, "closed -");
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      if (errno == EINTR) continue;
      return end(it, outcomeOf(errno));
    }
  }

  void expire(Clock::time_point now) {
    for (auto it = inFlight_.begin(); it != inFlight_.end();) {
      auto next = std::next(it);
      if (now >= it->second.deadline) end(it, "timeout -");
      it = next;
    }
  }

  void end(std::map<int, Request>::iterator it, const std::string& outcome) {
    const int fd = it->first;
    epoll_ctl(epoll_, EPOLL_CTL_DEL, fd, nullptr);
    close(fd);
    finish(it->second, outcome);
    inFlight_.erase(it);
  }

  void finish(const Request& r, const std::string& outcome) {
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - r.sent).count();
    std::fprintf(out_, "%.6f %s %.1f\n", r.sentWall, outcome.c_str(), ms);
    std::fflush(out_);
  }

  Options o_;
  FILE* out_ = nullptr;
  int epoll_ = -1;
  std::map<int, Request> inFlight_;
};

}  // namespace

int main(int argc, char** argv) {
  Options options = parseOptions(argc, argv);
  struct sigaction sa{};
  sa.sa_handler = onSignal;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);
  return Load(std::move(options)).run();
}
