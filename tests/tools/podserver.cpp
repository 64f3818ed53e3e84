// kproxy-podserver: a tiny "pod" for the data-path tests and the demo. It answers who it is and
// who it sees as the client, so a test can tell which endpoint a Service sent it to and whether
// the connection was masqueraded.
//
// Runs inside a pod network namespace. TCP (HTTP/1.1, keep-alive) on every --port:
//   GET /            -> "pod=<name> client=<ip>:<port>\n"
//   GET /healthz     -> "ok\n"
//   GET /stream?seconds=N&interval=S
//                    -> one "pod=<name> client=... seq=<i>" line every S seconds (default 0.2)
//                       for N seconds (default 5), then "... done=<count>", over one connection
//                       without a length (a long-lived flow for restart tests)
// UDP echo on every --udp-port: each datagram is answered with "pod=<name> client=<ip>:<port>\n".
// Every port listens on IPv4 and, where the namespace has IPv6, on IPv6 (an IPv6 client is
// written without brackets: client=fd00::2:40000).
//
// Plain POSIX sockets and a thread per connection: no library beyond libc and libstdc++, so it
// runs in the test VM's initramfs, which has no interpreter. It exits 0 on SIGTERM or SIGINT, 2
// on a bad command line and 1 when a port cannot be opened.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace {

std::string gPodName;

constexpr std::string_view kUsage =
    "usage: kproxy-podserver --name NAME [--port PORT]... [--udp-port PORT]...\n"
    "  --name NAME       pod name reported in every answer\n"
    "  --port PORT       TCP/HTTP port (repeatable; 8080 when none is given)\n"
    "  --udp-port PORT   UDP echo port (repeatable)\n";

[[noreturn]] void usageError(const std::string& message) {
  std::fprintf(stderr, "%.*skproxy-podserver: error: %s\n", static_cast<int>(kUsage.size()),
               kUsage.data(), message.c_str());
  std::exit(2);
}

struct Options {
  std::vector<int> tcpPorts;
  std::vector<int> udpPorts;
};

int parsePort(const std::string& flag, const std::string& value) {
  char* end = nullptr;
  errno = 0;
  long port = std::strtol(value.c_str(), &end, 10);
  if (value.empty() || *end != '\0' || errno != 0 || port < 0 || port > 65535) {
    usageError("argument " + flag + ": invalid port: '" + value + "'");
  }
  return static_cast<int>(port);
}

Options parseOptions(int argc, char** argv) {
  Options options;
  std::optional<std::string> name;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      std::fputs(kUsage.data(), stdout);
      std::exit(0);
    }
    // Both "--flag value" and "--flag=value", as the command lines of the tests use either.
    std::string flag = arg, value;
    if (auto eq = arg.find('='); arg.starts_with("--") && eq != std::string::npos) {
      flag = arg.substr(0, eq);
      value = arg.substr(eq + 1);
    } else if (arg == "--name" || arg == "--port" || arg == "--udp-port") {
      if (i + 1 >= argc) usageError("argument " + arg + ": expected one argument");
      value = argv[++i];
    }
    if (flag == "--name") {
      name = value;
    } else if (flag == "--port") {
      options.tcpPorts.push_back(parsePort(flag, value));
    } else if (flag == "--udp-port") {
      options.udpPorts.push_back(parsePort(flag, value));
    } else {
      usageError("unrecognized arguments: " + arg);
    }
  }
  if (!name) usageError("the following arguments are required: --name");
  gPodName = *name;
  if (options.tcpPorts.empty()) options.tcpPorts.push_back(8080);
  return options;
}

// "[8080, 8081]": how the start-up line has always listed the ports.
std::string portList(const std::vector<int>& ports) {
  std::string out = "[";
  for (std::size_t i = 0; i < ports.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(ports[i]);
  }
  return out + "]";
}

// The peer's address without brackets and its port.
std::pair<std::string, int> peerOf(const sockaddr_storage& peer) {
  char text[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (peer.ss_family == AF_INET) {
    const auto& in = reinterpret_cast<const sockaddr_in&>(peer);
    inet_ntop(AF_INET, &in.sin_addr, text, sizeof text);
    port = ntohs(in.sin_port);
  } else if (peer.ss_family == AF_INET6) {
    const auto& in6 = reinterpret_cast<const sockaddr_in6&>(peer);
    inet_ntop(AF_INET6, &in6.sin6_addr, text, sizeof text);
    port = ntohs(in6.sin6_port);
  }
  return {text, port};
}

std::string identity(const sockaddr_storage& peer) {
  auto [address, port] = peerOf(peer);
  return "pod=" + gPodName + " client=" + address + ":" + std::to_string(port);
}

// Writes all of DATA; false once the peer is gone (no SIGPIPE: MSG_NOSIGNAL).
bool sendAll(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data.remove_prefix(static_cast<std::size_t>(n));
  }
  return true;
}

std::string httpDate() {
  char buf[64];
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  std::strftime(buf, sizeof buf, "%a, %d %b %Y %H:%M:%S GMT", &tm);
  return buf;
}

std::string statusLine(int status) {
  const char* reason = status == 200   ? "OK"
                       : status == 400 ? "Bad Request"
                       : status == 501 ? "Not Implemented"
                                       : "Error";
  return "HTTP/1.1 " + std::to_string(status) + " " + reason +
         "\r\nServer: kproxy-podserver\r\nDate: " + httpDate() + "\r\n";
}

std::string textResponse(int status, std::string_view body, bool close) {
  std::string out = statusLine(status);
  out += "Content-Type: text/plain\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  if (close) out += "Connection: close\r\n";
  out += "\r\n";
  out += body;
  return out;
}

// The value of KEY in a query string ("seconds=2&interval=0.1"), or nothing.
std::optional<std::string> queryValue(std::string_view query, std::string_view key) {
  while (!query.empty()) {
    auto amp = query.find('&');
    std::string_view pair = query.substr(0, amp);
    auto eq = pair.find('=');
    if (eq != std::string_view::npos && pair.substr(0, eq) == key) {
      return std::string(pair.substr(eq + 1));
    }
    if (amp == std::string_view::npos) break;
    query.remove_prefix(amp + 1);
  }
  return std::nullopt;
}

std::optional<double> queryNumber(std::string_view query, std::string_view key, double fallback) {
  auto text = queryValue(query, key);
  if (!text) return fallback;
  char* end = nullptr;
  double value = std::strtod(text->c_str(), &end);
  if (text->empty() || *end != '\0' || !std::isfinite(value)) return std::nullopt;
  return value;
}

// /stream: lines until the deadline, then the count; the body ends when the connection closes.
void stream(int fd, const std::string& who, double seconds, double interval) {
  std::string head = statusLine(200) + "Content-Type: text/plain\r\nConnection: close\r\n\r\n";
  if (!sendAll(fd, head)) return;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  int seq = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    if (!sendAll(fd, who + " seq=" + std::to_string(seq) + "\n")) return;
    ++seq;
    std::this_thread::sleep_for(std::chrono::duration<double>(std::max(interval, 0.0)));
  }
  sendAll(fd, who + " done=" + std::to_string(seq) + "\n");
}

// Reads one request head (up to the empty line) into HEAD; BUFFER keeps what came after it.
bool readHead(int fd, std::string& buffer, std::string& head) {
  constexpr std::size_t kMaxHead = 64 * 1024;
  for (;;) {
    auto end = buffer.find("\r\n\r\n");
    std::size_t skip = 4;
    if (auto bare = buffer.find("\n\n"); bare != std::string::npos && bare < end) {
      end = bare;
      skip = 2;
    }
    if (end != std::string::npos) {
      head = buffer.substr(0, end);
      buffer.erase(0, end + skip);
      return true;
    }
    if (buffer.size() > kMaxHead) return false;
    char chunk[4096];
    ssize_t n = ::recv(fd, chunk, sizeof chunk, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    buffer.append(chunk, static_cast<std::size_t>(n));
  }
}

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

void logRequest(const std::string& peerAddress, const std::string& requestLine, int status) {
  std::fprintf(stderr, "%s %s \"%s\" %d -\n", gPodName.c_str(), peerAddress.c_str(),
               requestLine.c_str(), status);
}

// One connection: requests until the client closes or asks to (HTTP/1.0 without keep-alive,
// or "Connection: close"), or a stream ends.
void serveConnection(int fd, sockaddr_storage peer) {
  const std::string who = identity(peer);
  const std::string peerAddress = peerOf(peer).first;
  std::string buffer, head;
  while (readHead(fd, buffer, head)) {
    auto eol = head.find('\n');
    std::string requestLine = head.substr(0, eol);
    if (!requestLine.empty() && requestLine.back() == '\r') requestLine.pop_back();
    std::string headers = eol == std::string::npos ? "" : lower(head.substr(eol + 1));
    auto sp1 = requestLine.find(' ');
    auto sp2 = sp1 == std::string::npos ? sp1 : requestLine.find(' ', sp1 + 1);
    if (sp2 == std::string::npos || !requestLine.substr(sp2 + 1).starts_with("HTTP/")) {
      logRequest(peerAddress, requestLine, 400);
      sendAll(fd, textResponse(400, "Bad request syntax\n", true));
      break;
    }
    std::string method = requestLine.substr(0, sp1);
    std::string target = requestLine.substr(sp1 + 1, sp2 - sp1 - 1);
    std::string version = requestLine.substr(sp2 + 1);
    bool close = version == "HTTP/1.0" ? headers.find("connection: keep-alive") == std::string::npos
                                        : headers.find("connection: close") != std::string::npos;
    if (method != "GET") {
      logRequest(peerAddress, requestLine, 501);
      sendAll(fd, textResponse(501, "Unsupported method ('" + method + "')\n", true));
      break;
    }
    auto question = target.find('?');
    std::string path = target.substr(0, question);
    std::string query = question == std::string::npos ? "" : target.substr(question + 1);
    if (path == "/stream") {
      auto seconds = queryNumber(query, "seconds", 5);
      auto interval = queryNumber(query, "interval", 0.2);
      if (!seconds || !interval) {
        logRequest(peerAddress, requestLine, 400);
        sendAll(fd, textResponse(400, "seconds and interval must be numbers\n", true));
        break;
      }
      logRequest(peerAddress, requestLine, 200);
      stream(fd, who, *seconds, *interval);
      break;
    }
    logRequest(peerAddress, requestLine, 200);
    std::string body = path == "/healthz" ? "ok\n" : who + "\n";
    if (!sendAll(fd, textResponse(200, body, false)) || close) break;
  }
  ::close(fd);
}

// A socket bound to PORT on the wildcard address of FAMILY (IPv6 sockets take IPv6 only, so
// that IPv4 clients are seen as plain IPv4 addresses on the IPv4 socket), or -1 with errno.
int openSocket(int family, int type, int port) {
  int fd = ::socket(family, type | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_storage address{};
  socklen_t length;
  if (family == AF_INET6) {
    ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
    auto& in6 = reinterpret_cast<sockaddr_in6&>(address);
    in6.sin6_family = AF_INET6;
    in6.sin6_addr = in6addr_any;
    in6.sin6_port = htons(static_cast<std::uint16_t>(port));
    length = sizeof in6;
  } else {
    auto& in = reinterpret_cast<sockaddr_in&>(address);
    in.sin_family = AF_INET;
    in.sin_addr.s_addr = htonl(INADDR_ANY);
    in.sin_port = htons(static_cast<std::uint16_t>(port));
    length = sizeof in;
  }
  if (::bind(fd, reinterpret_cast<sockaddr*>(&address), length) != 0 ||
      (type == SOCK_STREAM && ::listen(fd, 128) != 0)) {
    int saved = errno;
    ::close(fd);
    errno = saved;
    return -1;
  }
  return fd;
}

void acceptLoop(int listener) {
  for (;;) {
    sockaddr_storage peer{};
    socklen_t length = sizeof peer;
    int fd = ::accept4(listener, reinterpret_cast<sockaddr*>(&peer), &length, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      std::fprintf(stderr, "%s accept failed: %s\n", gPodName.c_str(), std::strerror(errno));
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      continue;
    }
    std::thread(serveConnection, fd, peer).detach();
  }
}

// Answers each datagram from the address it was sent to (its packet info), not the one the
// route would pick: a client connected to a second address of the pod takes only replies from it.
void udpEchoLoop(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_IP, IP_PKTINFO, &one, sizeof one);         // fails on the IPv6 socket
  ::setsockopt(fd, IPPROTO_IPV6, IPV6_RECVPKTINFO, &one, sizeof one);  // fails on the IPv4 one
  std::vector<char> datagram(65535);
  for (;;) {
    sockaddr_storage peer{};
    alignas(cmsghdr) char control[256];
    iovec in{datagram.data(), datagram.size()};
    msghdr msg{.msg_name = &peer, .msg_namelen = sizeof peer, .msg_iov = &in, .msg_iovlen = 1,
               .msg_control = control, .msg_controllen = sizeof control, .msg_flags = 0};
    ssize_t n = ::recvmsg(fd, &msg, 0);
    if (n < 0) continue;
    std::string reply = identity(peer) + "\n";
    iovec out{reply.data(), reply.size()};
    msg.msg_iov = &out;
    msg.msg_flags = 0;
    // The packet info goes back as it came: its local address becomes the source.
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c))
      if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_PKTINFO)
        reinterpret_cast<in_pktinfo*>(CMSG_DATA(c))->ipi_ifindex = 0;
    ::sendmsg(fd, &msg, 0);
  }
}

// Opens PORT for both families and starts LOOP on each socket. IPv4 must work; IPv6 may be
// missing from the kernel or the namespace (then said once on stderr).
void listenOn(int type, int port, void (*loop)(int)) {
  const char* kind = type == SOCK_STREAM ? "tcp" : "udp";
  int v4 = openSocket(AF_INET, type, port);
  if (v4 < 0) {
    std::fprintf(stderr, "kproxy-podserver: cannot open %s port %d: %s\n", kind, port,
                 std::strerror(errno));
    std::exit(1);
  }
  std::thread(loop, v4).detach();
  int v6 = openSocket(AF_INET6, type, port);
  if (v6 < 0) {
    std::fprintf(stderr, "kproxy-podserver: no IPv6 on %s port %d: %s\n", kind, port,
                 std::strerror(errno));
    return;
  }
  std::thread(loop, v6).detach();
}

}  // namespace

int main(int argc, char** argv) {
  Options options = parseOptions(argc, argv);
  // The signals are waited for by the main thread only: block them before any thread starts.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  // Log lines go out whole and at once, also into a file.
  std::setvbuf(stderr, nullptr, _IOLBF, 0);

  for (int port : options.tcpPorts) listenOn(SOCK_STREAM, port, acceptLoop);
  for (int port : options.udpPorts) listenOn(SOCK_DGRAM, port, udpEchoLoop);
  std::fprintf(stderr, "podserver name=%s tcp=%s udp=%s\n", gPodName.c_str(),
               portList(options.tcpPorts).c_str(), portList(options.udpPorts).c_str());
  int signal = 0;
  sigwait(&stop, &signal);
  return 0;
}
