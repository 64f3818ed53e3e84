#pragma once
/// MessageBuffer: the bytes of one netlink batch, as it is encoded. A first sync's transaction
/// is tens of MiB at 10,000 Services, so the buffer lives in a mapping of its own: growing it
/// moves page tables (mremap), never copies, so the old and the new buffer are never resident
/// at once; room reserved but not written is never resident; and destroying it gives the pages
/// back to the system at once, where freed heap would stay with the process.
/// Thread-safety: a value owned by one thread.

#include <linux/netlink.h>

#include <cstddef>
#include <span>

namespace kproxy::backends {

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

}  // namespace kproxy::backends
