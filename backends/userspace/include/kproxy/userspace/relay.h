#pragma once
/// TcpRelay: moves the bytes of one proxied TCP connection both ways until both sides have
/// closed. Data goes through a pipe with splice(2), never through user memory (a plain
/// read/write buffer when the kernel refuses to splice); Boost.Asio only says when a socket is
/// ready. Half-close is relayed: the end of one direction (EOF once its pipe is drained) becomes
/// shutdown(SHUT_WR) on the other socket, and the other direction keeps going. A reset or error
/// on either side resets the other (SO_LINGER 0) and ends both.
///
/// Thread-safety: every member runs on the io_context's thread (one thread); the relay keeps
/// itself alive (shared_from_this) while a wait is pending. splice(2) into a socket whose peer
/// has gone raises SIGPIPE (it has no MSG_NOSIGNAL), which would end the whole process: the
/// thread that runs relays must call blockSigpipeOnThisThread() first.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include <utility>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>

namespace kproxy::userspace {

/// Blocks SIGPIPE for the calling thread only (the process's disposition is the host's): a write
/// to a closed peer then fails with EPIPE, and the relay drops the pending signal.
void blockSigpipeOnThisThread();

class TcpRelay : public std::enable_shared_from_this<TcpRelay> {
 public:
  using Socket = boost::asio::ip::tcp::socket;
  struct Options {
    /// Close both sides after this long without a byte either way; zero: never.
    std::chrono::milliseconds idleTimeout{0};
    /// Try splice(2) first (tests turn it off to cover the buffer path).
    bool splice = true;
  };
  /// Bytes moved since the last report: client → endpoint, endpoint → client. Reported at
  /// least every kReportBytes and when the relay ends.
  using BytesReport = std::function<void(std::uint64_t toEndpoint, std::uint64_t toClient)>;
  /// Called once when the relay has ended (both directions done, an error, or close()).
  using Done = std::function<void()>;
  static constexpr std::uint64_t kReportBytes = 1 << 20;

  /// Both sockets connected, of the same io_context; they are made non-blocking.
  TcpRelay(Socket client, Socket endpoint, Options options, BytesReport report, Done done);
  ~TcpRelay();
  TcpRelay(const TcpRelay&) = delete;
  TcpRelay& operator=(const TcpRelay&) = delete;

  void start();
  /// Ends the relay now: both sockets are closed (with `reset`, as a TCP reset). Idempotent.
  void close(bool reset = false);
  bool ended() const { return ended_; }
  /// Bytes relayed so far: client → endpoint, endpoint → client.
  std::uint64_t toEndpoint() const { return dirs_[0].total; }
  std::uint64_t toClient() const { return dirs_[1].total; }

 private:
  struct Direction {
    Socket* from = nullptr;
    Socket* to = nullptr;
    int pipe[2] = {-1, -1};
    std::size_t capacity = 1 << 16;  ///< the pipe's
    std::size_t queued = 0;  ///< bytes read but not yet written (pipe or buffer)
    std::size_t offset = 0;  ///< buffer path: where the queued bytes start
    std::vector<char> buffer;
    bool eof = false;
    bool done = false;
    std::uint64_t total = 0;
    std::uint64_t unreported = 0;
  };
  void pump(int index);
  /// One step of the direction: >0 progress, 0 would block (a wait is armed), <0 ended/failed.
  int step(int index);
  void finishIfDone();
  void armIdle();
  /// Hands the bytes not yet reported to the owner.
  void report();

  Socket client_;
  Socket endpoint_;
  Options options_;
  BytesReport report_;
  Done done_;
  Direction dirs_[2];
  boost::asio::steady_timer idle_;
  std::chrono::steady_clock::time_point lastActivity_;
  bool splice_ = true;
  bool ended_ = false;
};

}  // namespace kproxy::userspace
