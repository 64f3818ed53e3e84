#include "kproxy/kernel/message_buffer.h"

#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

namespace kproxy::kernel {

MessageBuffer::MessageBuffer(MessageBuffer&& other) noexcept
    : buf_(std::exchange(other.buf_, nullptr)),
      capacity_(std::exchange(other.capacity_, 0)),
      used_(std::exchange(other.used_, 0)) {}

MessageBuffer& MessageBuffer::operator=(MessageBuffer&& other) noexcept {
  if (this != &other) {
    std::free(buf_);
    buf_ = std::exchange(other.buf_, nullptr);
    capacity_ = std::exchange(other.capacity_, 0);
    used_ = std::exchange(other.used_, 0);
  }
  return *this;
}

MessageBuffer::~MessageBuffer() { std::free(buf_); }

void MessageBuffer::grow(std::size_t atLeast) {
  std::size_t want = capacity_ + capacity_ / 2;
  if (want < atLeast) want = atLeast;
  void* p = std::realloc(buf_, want);
  if (p == nullptr) throw std::bad_alloc();
  buf_ = static_cast<char*>(p);
  capacity_ = want;
}

char* MessageBuffer::tail(std::size_t room) {
  if (capacity_ - used_ < room) grow(used_ + room);
  return buf_ + used_;
}

void MessageBuffer::append(std::span<const char> bytes) {
  if (bytes.empty()) return;
  std::memcpy(tail(bytes.size()), bytes.data(), bytes.size());
  used_ += bytes.size();
}

void MessageBuffer::reserve(std::size_t bytes) {
  if (bytes > capacity_) grow(bytes);
}

}  // namespace kproxy::kernel
