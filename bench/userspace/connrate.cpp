// kproxy-bench-connrate: many TCP connections, short or kept for several requests, for the
// userspace and ebpf benchmarks (bench/userspace/run.sh, bench/ebpf/run.sh).
//
//   kproxy-bench-connrate server PORT [THREADS]
//       answers every request (a tiny HTTP GET) with a tiny reply once it has read it. After an
//       HTTP/1.0 request it closes the connection (the server side closes first, as an HTTP/1.0
//       server does); after an HTTP/1.1 one it waits for the next request on it.
//   kproxy-bench-connrate client IP PORT SECONDS CONCURRENCY [REQUESTS]
//       CONCURRENCY threads each connect, make REQUESTS requests on the connection (default 1),
//       the last one HTTP/1.0 and the others HTTP/1.1, read the last reply to its end and close,
//       again and again for SECONDS; prints "requests=N failures=F seconds=S rate=R p50_us=A
//       p99_us=B connections=C". N counts the requests answered, R is N per second, and A and B
//       are the percentiles of every answered request's time to its reply's first byte, in
//       microseconds: for a connection's first request from just before connect(), for the
//       others from just before their send(). F counts the connections that failed (a failed
//       connection's requests answered before it count in N). Every thread tries at least once;
//       the status is 0 when a request was answered and no connection failed. With REQUESTS at
//       1 every connection carries one request: the connection rate and connect-to-first-byte.
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
// A request after which the connection stays open for the next one.
constexpr char kKeepRequest[] = "GET / HTTP/1.1\r\nHost: bench\r\n\r\n";
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
        // Each request is answered once it is whole; an HTTP/1.0 one ends the connection, as does
        // the client's close.
        std::string got;
        bool open = true;
        while (open) {
          const auto end = got.find("\r\n\r\n");
          if (end == std::string::npos) {
            auto n = ::recv(c, buf, sizeof buf, 0);
            if (n <= 0) break;
            got.append(buf, static_cast<std::size_t>(n));
            continue;
          }
          open = got.compare(0, end, kKeepRequest, std::strlen(kKeepRequest) - 4) == 0;
          got.erase(0, end + 4);
          if (::send(c, kReply, sizeof kReply - 1, MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof kReply - 1)) break;
        }
        ::close(c);
      }
    });
  }
  for (auto& w : workers) w.join();
  return 0;
}

// exchange — sends REQUEST on s and reads its reply: to the end of the connection when the
// server closes after it (last), else exactly the reply's length. The time from began to the
// reply's first byte goes to first_byte_us. False when the send, a read or the reply failed.
bool exchange(int s, const char* request, std::size_t length, bool last, std::chrono::steady_clock::time_point began,
              std::uint32_t& first_byte_us) {
  if (::send(s, request, length, MSG_NOSIGNAL) != static_cast<ssize_t>(length)) return false;
  char buf[512];
  std::size_t total = 0;
  constexpr std::size_t kWant = sizeof kReply - 1;
  while (last || total < kWant) {
    auto n = ::recv(s, buf, last ? sizeof buf : kWant - total, 0);
    if (n < 0) return false;
    if (n == 0) break;
    if (total == 0)
      first_byte_us = static_cast<std::uint32_t>(
          std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - began).count());
    total += static_cast<std::size_t>(n);
  }
  return total == kWant;
}

int client(const char* ip, int port, double seconds, int concurrency, int requests) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  if (::inet_pton(AF_INET, ip, &a.sin_addr) != 1) {
    std::fprintf(stderr, "bad address %s\n", ip);
    return 2;
  }
  if (requests < 1) {
    std::fprintf(stderr, "REQUESTS must be 1 or more\n");
    return 2;
  }
  std::atomic<long> done{0}, failed{0}, connections{0};
  const auto start = std::chrono::steady_clock::now();
  const auto end =
      start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(seconds));
  std::mutex latencies_mutex;
  std::vector<std::uint32_t> latencies;  // microseconds, to each reply's first byte
  std::vector<std::thread> workers;
  for (int t = 0; t < concurrency; ++t) {
    workers.emplace_back([&] {
      std::vector<std::uint32_t> mine;
      mine.reserve(1 << 16);
      // At least once: a thread that starts after SECONDS are over (a short run on a loaded
      // machine) still tries.
      do {
        auto began = std::chrono::steady_clock::now();
        int s = ::socket(AF_INET, SOCK_STREAM, 0);
        // A connect or a reply that takes over 2 s is a failure (SO_SNDTIMEO bounds connect()),
        // not a stall that stretches the run.
        timeval tv{2, 0};
        ::setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        ::setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
        bool ok = ::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
        for (int r = 0; ok && r < requests; ++r) {
          const bool last = r + 1 == requests;
          if (r > 0) began = std::chrono::steady_clock::now();
          std::uint32_t first_byte_us = 0;
          ok = last ? exchange(s, kRequest, sizeof kRequest - 1, true, began, first_byte_us)
                    : exchange(s, kKeepRequest, sizeof kKeepRequest - 1, false, began, first_byte_us);
          if (ok) {
            done++;
            mine.push_back(first_byte_us);
          }
        }
        ::close(s);
        connections++;
        if (!ok) failed++;
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
  std::printf("requests=%ld failures=%ld seconds=%.2f rate=%.0f p50_us=%lu p99_us=%lu connections=%ld\n", done.load(),
              failed.load(), took, static_cast<double>(done.load()) / took, percentile(0.50), percentile(0.99),
              connections.load());
  return failed.load() == 0 && done.load() > 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 3 && std::strcmp(argv[1], "server") == 0) return serve(std::atoi(argv[2]), argc > 3 ? std::atoi(argv[3]) : 2);
  if ((argc == 6 || argc == 7) && std::strcmp(argv[1], "client") == 0)
    return client(argv[2], std::atoi(argv[3]), std::atof(argv[4]), std::atoi(argv[5]),
                  argc == 7 ? std::atoi(argv[6]) : 1);
  std::fprintf(stderr, "usage: %s server PORT [THREADS] | client IP PORT SECONDS CONCURRENCY [REQUESTS]\n",
               argv[0]);
  return 2;
}
