#include "kproxy/userspace/relay.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "asio.h"

namespace kproxy::userspace {
namespace {

constexpr std::size_t kChunk = 1 << 16;  ///< bytes moved per read (buffer path)
/// Pipe capacity asked for (F_SETPIPE_SZ; the kernel's default is 64 KiB): bigger splices, fewer
/// wake-ups per byte on a bulk transfer. Pages are only taken while data sits in the pipe.
constexpr int kPipeSize = 1 << 18;
/// Steps per readiness event before yielding to other connections on the thread.
constexpr int kStepsPerTurn = 64;

sigset_t sigpipeSet() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGPIPE);
  return set;
}

/// Takes the SIGPIPE an EPIPE left pending on this thread (blocked, so it did nothing).
void dropPendingSigpipe() {
  const sigset_t set = sigpipeSet();
  const timespec zero{0, 0};
  while (::sigtimedwait(&set, nullptr, &zero) == SIGPIPE) {
  }
}

void setLingerZero(TcpRelay::Socket& s) {
  boost::system::error_code ec;
  s.set_option(boost::asio::socket_base::linger(true, 0), ec);
}

}  // namespace

void blockSigpipeOnThisThread() {
  const sigset_t set = sigpipeSet();
  ::pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

TcpRelay::TcpRelay(Socket client, Socket endpoint, Options options, BytesReport report, Done done)
    : client_(std::move(client)),
      endpoint_(std::move(endpoint)),
      options_(options),
      report_(std::move(report)),
      done_(std::move(done)),
      idle_(client_.get_executor()),
      splice_(options.splice) {
  dirs_[0].from = &client_;
  dirs_[0].to = &endpoint_;
  dirs_[1].from = &endpoint_;
  dirs_[1].to = &client_;
  boost::system::error_code ec;
  client_.non_blocking(true, ec);
  endpoint_.non_blocking(true, ec);
  for (auto& d : dirs_) {
    if (splice_ && ::pipe2(d.pipe, O_NONBLOCK | O_CLOEXEC) != 0) splice_ = false;
    // Refused above /proc/sys/fs/pipe-max-size for an unprivileged process: the default stays.
    if (splice_)
      d.capacity = static_cast<std::size_t>(
          std::max({::fcntl(d.pipe[1], F_SETPIPE_SZ, kPipeSize), ::fcntl(d.pipe[1], F_GETPIPE_SZ), 4096}));
  }
  if (!splice_)
    for (auto& d : dirs_) d.buffer.resize(kChunk);
}

TcpRelay::~TcpRelay() {
  for (auto& d : dirs_)
    for (int& fd : d.pipe)
      if (fd >= 0) ::close(fd);
}

void TcpRelay::start() {
  lastActivity_ = std::chrono::steady_clock::now();
  armIdle();
  pump(0);
  pump(1);
}

void TcpRelay::pump(int index) {
  Direction& d = dirs_[index];
  for (int i = 0; i < kStepsPerTurn; ++i) {
    if (ended_ || d.done) return;
    const int r = step(index);
    if (r <= 0) return;
  }
  // Busy: let the other connections of the thread run, then continue.
  boost::asio::post(client_.get_executor(), [self = shared_from_this(), index] { self->pump(index); });
}

int TcpRelay::step(int index) {
  Direction& d = dirs_[index];
  auto wait = [&](Socket& s, Socket::wait_type type) {
    s.async_wait(type, [self = shared_from_this(), index](const boost::system::error_code& ec) {
      if (ec || self->ended_) return;
      self->pump(index);
    });
    return 0;
  };
  const int in = d.from->native_handle();
  const int out = d.to->native_handle();
  if (d.queued > 0) {
    ssize_t n = splice_ ? ::splice(d.pipe[0], nullptr, out, nullptr, d.queued, SPLICE_F_MOVE | SPLICE_F_NONBLOCK)
                        : ::send(out, d.buffer.data() + d.offset, d.queued, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      d.queued -= static_cast<std::size_t>(n);
      d.offset = d.queued == 0 ? 0 : d.offset + static_cast<std::size_t>(n);
      d.total += static_cast<std::uint64_t>(n);
      d.unreported += static_cast<std::uint64_t>(n);
      lastActivity_ = std::chrono::steady_clock::now();
      if (d.unreported >= kReportBytes) report();
      return 1;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return wait(*d.to, Socket::wait_write);
    if (n < 0 && errno == EINTR) return 1;
    if (n < 0 && errno == EPIPE) dropPendingSigpipe();
    close(true);  // a reset (or any error) on one side resets the other
    return -1;
  }
  if (d.eof) {
    // Everything read has been written: pass the end on, keep the other direction going.
    ::shutdown(out, SHUT_WR);
    d.done = true;
    finishIfDone();
    return -1;
  }
  ssize_t n = splice_ ? ::splice(in, nullptr, d.pipe[1], nullptr, d.capacity, SPLICE_F_MOVE | SPLICE_F_NONBLOCK)
                      : ::recv(in, d.buffer.data(), d.buffer.size(), MSG_DONTWAIT);
  if (n > 0) {
    d.queued = static_cast<std::size_t>(n);
    d.offset = 0;
    return 1;
  }
  if (n == 0) {
    d.eof = true;
    return 1;
  }
  if (errno == EAGAIN || errno == EWOULDBLOCK) return wait(*d.from, Socket::wait_read);
  if (errno == EINTR) return 1;
  if (splice_ && errno == EINVAL && d.total == 0 && dirs_[0].total == 0 && dirs_[1].total == 0) {
    // A socket the kernel cannot splice: fall back to a buffer for both directions.
    splice_ = false;
    for (auto& dir : dirs_) dir.buffer.resize(kChunk);
    return 1;
  }
  // A reset (or any error) on one side resets the other: the peer must not mistake a broken
  // connection for a clean end of data.
  close(true);
  return -1;
}

void TcpRelay::finishIfDone() {
  if (dirs_[0].done && dirs_[1].done) close(false);
}

void TcpRelay::close(bool reset) {
  if (ended_) return;
  ended_ = true;
  boost::system::error_code ec;
  if (reset) {
    setLingerZero(client_);
    setLingerZero(endpoint_);
  }
  idle_.cancel();
  client_.close(ec);
  endpoint_.close(ec);
  report();
  if (done_) {
    auto done = std::move(done_);
    done_ = nullptr;
    done();
  }
}

void TcpRelay::armIdle() {
  if (options_.idleTimeout.count() <= 0 || ended_) return;
  const auto deadline = lastActivity_ + options_.idleTimeout;
  idle_.expires_at(deadline);
  idle_.async_wait([self = shared_from_this()](const boost::system::error_code& ec) {
    if (ec || self->ended_) return;
    if (std::chrono::steady_clock::now() - self->lastActivity_ >= self->options_.idleTimeout)
      self->close(false);
    else
      self->armIdle();
  });
}

void TcpRelay::report() {
  if (dirs_[0].unreported == 0 && dirs_[1].unreported == 0) return;
  const auto a = dirs_[0].unreported, b = dirs_[1].unreported;
  dirs_[0].unreported = dirs_[1].unreported = 0;
  if (report_) report_(a, b);
}

}  // namespace kproxy::userspace
