#include "kproxy/backends/common/message_buffer.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <new>
#include <utility>

namespace kproxy::backends {

MessageBuffer::MessageBuffer(MessageBuffer&& other) noexcept
    : buf_(std::exchange(other.buf_, nullptr)),
      capacity_(std::exchange(other.capacity_, 0)),
      used_(std::exchange(other.used_, 0)) {}

MessageBuffer& MessageBuffer::operator=(MessageBuffer&& other) noexcept {
  if (this != &other) {
    if (buf_ != nullptr) ::munmap(buf_, capacity_);
    buf_ = std::exchange(other.buf_, nullptr);
    capacity_ = std::exchange(other.capacity_, 0);
    used_ = std::exchange(other.used_, 0);
  }
  return *this;
}

MessageBuffer::~MessageBuffer() {
  if (buf_ != nullptr) ::munmap(buf_, capacity_);
}

void MessageBuffer::grow(std::size_t atLeast) {
  static const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  std::size_t want = capacity_ + capacity_ / 2;
  if (want < atLeast) want = atLeast;
  want = (want + page - 1) / page * page;
  void* p = buf_ == nullptr ? ::mmap(nullptr, want, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
                            : ::mremap(buf_, capacity_, want, MREMAP_MAYMOVE);
  if (p == MAP_FAILED) throw std::bad_alloc();
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

}  // namespace kproxy::backends
