#pragma once
/// MessageBuffer: the bytes of one netlink batch, as they are encoded, shared by the nftables
/// backend and iptables-nft's writer. It is never zero-filled (only the bytes written become
/// resident) and grows with realloc, which glibc does in place at the heap's end or, for
/// blocks above its mmap threshold, by mremap; why not a mapping of its own: BENCHMARKS.md,
/// "Figures behind the code".
/// Thread-safety: a value owned by one thread.

#include <linux/netlink.h>

#include <cstddef>
#include <span>

namespace kproxy::kernel {

class MessageBuffer {
 public:
  MessageBuffer() = default;
  MessageBuffer(const MessageBuffer&) = delete;
  MessageBuffer& operator=(const MessageBuffer&) = delete;
  MessageBuffer(MessageBuffer&& other) noexcept;
  MessageBuffer& operator=(MessageBuffer&& other) noexcept;
  ~MessageBuffer();

  /// Room for one message of at most `room` bytes at the end. Throws std::bad_alloc.
  char* tail(std::size_t room = 1 << 16);
  /// Takes the message just written at tail() (its length aligned, as netlink lays them out).
  void commit(const nlmsghdr* nlh) { used_ += NLMSG_ALIGN(nlh->nlmsg_len); }
  /// Appends bytes as they are.
  void append(std::span<const char> bytes);
  /// Capacity for at least `bytes` in all.
  void reserve(std::size_t bytes);
  /// Drops what follows the first `size` bytes (the mapping stays).
  void truncate(std::size_t size) { used_ = size < used_ ? size : used_; }
  void clear() { used_ = 0; }

  std::size_t size() const { return used_; }
  bool empty() const { return used_ == 0; }
  std::span<const char> data() const { return {buf_, used_}; }

 private:
  void grow(std::size_t atLeast);
  char* buf_ = nullptr;
  std::size_t capacity_ = 0;
  std::size_t used_ = 0;
};

}  // namespace kproxy::kernel
