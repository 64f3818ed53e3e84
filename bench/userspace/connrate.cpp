// kproxy-bench-connrate: many short TCP connections, for the userspace benchmark (run.sh).
//
//   kproxy-bench-connrate server PORT [THREADS]
//       answers every connection with a tiny HTTP/1.0 reply once it has read the request, then
//       closes it (the server side closes first, as an HTTP/1.0 server does).
//   kproxy-bench-connrate client IP PORT SECONDS CONCURRENCY
//       CONCURRENCY threads each connect, send a request, read the reply to its end and close,
//       again and again for SECONDS; prints "requests=N failures=F seconds=S rate=R p50_us=A
//       p99_us=B", the last two the connect-to-first-byte times of the successful requests
//       (from just before connect() to the reply's first byte), in microseconds. Every thread
//       tries at least once; the status is 0 when a request succeeded and none failed.
//
// A small tool of its own rather than ab or wrk: one binary for both ends, and no package
// beyond the build.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr char kRequest[] = "GET / HTTP/1.0\r\nHost: bench\r\n\r\n";
constexpr char kReply[] = "HTTP/1.0 200 OK\r\nContent-Length: 3\r\n\r\nok\n";

int serve(int port, int threads) {
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([port] {
      int s = ::socket(AF_INET, SOCK_STREAM, 0);
      int on = 1;
      ::setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
      ::setsockopt(s, SOL_SOCKET, SO_REUSEPORT, &on, sizeof on);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_port = htons(static_cast<std::uint16_t>(port));
      if (::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(s, 4096) != 0) {
        std::perror("bind/listen");
        std::exit(1);
      }
      char buf[1024];
      for (;;) {
        int c = ::accept(s, nullptr, nullptr);
        if (c < 0) continue;
        std::string got;
        while (got.find("\r\n\r\n") == std::string::npos) {
          auto n = ::recv(c, buf, sizeof buf, 0);
          if (n <= 0) break;
          got.append(buf, static_cast<std::size_t>(n));
        }
        ::send(c, kReply, sizeof kReply - 1, MSG_NOSIGNAL);
        ::close(c);
      }
    });
  }
  for (auto& w : workers) w.join();
  return 0;
}

int client(const char* ip, int port, double seconds, int concurrency) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  if (::inet_pton(AF_INET, ip, &a.sin_addr) != 1) {
    std::fprintf(stderr, "bad address %s\n", ip);
    return 2;
  }
  std::atomic<long> done{0}, failed{0};
  const auto start = std::chrono::steady_clock::now();
  const auto end = start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(seconds));
  std::mutex latencies_mutex;
  std::vector<std::uint32_t> latencies;  // microseconds, connect to first byte
  std::vector<std::thread> workers;
  for (int t = 0; t < concurrency; ++t) {
    workers.emplace_back([&] {
      char buf[512];
      std::vector<std::uint32_t> mine;
      mine.reserve(1 << 16);
      // At least once: a thread that starts after SECONDS are over (a short run on a loaded
      // machine) still tries.
      do {
        const auto began = std::chrono::steady_clock::now();
        int s = ::socket(AF_INET, SOCK_STREAM, 0);
        // A connect or a reply that takes over 2 s is a failure (SO_SNDTIMEO bounds connect()),
        // not a stall that stretches the run.
        timeval tv{2, 0};
        ::setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        ::setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
        bool ok = ::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
                  ::send(s, kRequest, sizeof kRequest - 1, MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof kRequest - 1);
        std::size_t total = 0;
        std::uint32_t first_byte_us = 0;
        while (ok) {
          auto n = ::recv(s, buf, sizeof buf, 0);
          if (n < 0) ok = false;
          if (n <= 0) break;
          if (total == 0)
            first_byte_us = static_cast<std::uint32_t>(
                std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - began).count());
          total += static_cast<std::size_t>(n);
        }
        ::close(s);
        const bool good = ok && total == sizeof kReply - 1;
        (good ? done : failed)++;
        if (good) mine.push_back(first_byte_us);
      } while (std::chrono::steady_clock::now() < end);
      std::lock_guard<std::mutex> lock(latencies_mutex);
      latencies.insert(latencies.end(), mine.begin(), mine.end());
    });
  }
  for (auto& w : workers) w.join();
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::sort(latencies.begin(), latencies.end());
  auto percentile = [&latencies](double p) -> unsigned long {
    if (latencies.empty()) return 0;
    return latencies[static_cast<std::size_t>(p * static_cast<double>(latencies.size() - 1))];
  };
  std::printf("requests=%ld failures=%ld seconds=%.2f rate=%.0f p50_us=%lu p99_us=%lu\n", done.load(), failed.load(),
              took, static_cast<double>(done.load()) / took, percentile(0.50), percentile(0.99));
  return failed.load() == 0 && done.load() > 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 3 && std::strcmp(argv[1], "server") == 0) return serve(std::atoi(argv[2]), argc > 3 ? std::atoi(argv[3]) : 2);
  if (argc == 6 && std::strcmp(argv[1], "client") == 0)
    return client(argv[2], std::atoi(argv[3]), std::atof(argv[4]), std::atoi(argv[5]));
  std::fprintf(stderr, "usage: %s server PORT [THREADS] | client IP PORT SECONDS CONCURRENCY\n", argv[0]);
  return 2;
}
