#include "kproxy/kernel/sysctl.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>

namespace kproxy::kernel {
namespace {

using core::ErrorCategory;
using core::makeError;

}  // namespace

core::Result<std::string> SysctlFiles::read(std::string_view name) const {
  const auto file = pathOf(name);
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return makeError(ErrorCategory::kIo, "reading " + file.string(), errno);
  std::string text;
  char buffer[4096];
  int err = 0;
  for (;;) {
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n > 0) {
      text.append(buffer, static_cast<std::size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) err = errno;
    break;
  }
  ::close(fd);
  if (err != 0) return makeError(ErrorCategory::kIo, "reading " + file.string(), err);
  text.resize(std::min(text.size(), text.find('\n')));
  while (!text.empty() && (text.back() == ' ' || text.back() == '\t' || text.back() == '\r')) text.pop_back();
  return text;
}

core::Result<std::int64_t> SysctlFiles::readInt(std::string_view name) const {
  auto text = read(name);
  if (!text) return std::unexpected(text.error());
  std::string_view digits = *text;
  while (!digits.empty() && (digits.front() == ' ' || digits.front() == '\t')) digits.remove_prefix(1);
  std::int64_t value = 0;
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  if (digits.empty() || ec != std::errc{} || end != digits.data() + digits.size())
    return makeError(ErrorCategory::kDecode, pathOf(name).string() + " holds \"" + *text + "\", not an integer");
  return value;
}

core::Result<void> SysctlFiles::write(std::string_view name, std::string_view value) const {
  const auto file = pathOf(name);
  // No O_CREAT: a sysctl that does not exist must stay missing.
  const int fd = ::open(file.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC);
  if (fd < 0) return makeError(ErrorCategory::kIo, "writing " + file.string(), errno);
  std::string text(value);
  text += '\n';
  int err = 0;
  // procfs takes a value in one write; a short write is an error, not something to continue.
  ssize_t n;
  do {
    n = ::write(fd, text.data(), text.size());
  } while (n < 0 && errno == EINTR);
  if (n < 0) {
    err = errno;
  } else if (static_cast<std::size_t>(n) != text.size()) {
    err = EIO;
  }
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err != 0) return makeError(ErrorCategory::kIo, "writing " + std::string(value) + " to " + file.string(), err);
  return {};
}

bool kernelHasIPv6(const SysctlFiles& sysctls) {
  auto disabled = sysctls.readInt("net/ipv6/conf/all/disable_ipv6");
  return disabled && *disabled == 0;
}

core::Result<void> SysctlFiles::writeInt(std::string_view name, std::int64_t value) const {
  return write(name, std::to_string(value));
}

namespace {

class FileSysctls final : public Sysctls {
 public:
  explicit FileSysctls(std::filesystem::path root) : files_(std::move(root)) {}
  core::Result<std::int64_t> readInt(const std::string& name) override { return files_.readInt(name); }
  core::Result<void> writeInt(const std::string& name, std::int64_t value) override {
    return files_.writeInt(name, value);
  }

 private:
  SysctlFiles files_;
};

}  // namespace

std::unique_ptr<Sysctls> makeFileSysctls(std::filesystem::path root) {
  return std::make_unique<FileSysctls>(std::move(root));
}

}  // namespace kproxy::kernel
