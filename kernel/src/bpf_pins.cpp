// removeBpfPins (bpf_pins.h): BPF_OBJ_GET and BPF_LINK_DETACH by the raw syscall.
#include "kproxy/kernel/bpf_pins.h"

#include <dirent.h>
#include <linux/bpf.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <vector>

namespace kproxy::kernel {
namespace {

long bpfCall(int command, bpf_attr& attr) { return ::syscall(__NR_bpf, command, &attr, sizeof attr); }

/// Detaches the link pinned at `path`; anything else pinned there (a map) is left as it is.
void detachIfLink(const std::string& path) {
  bpf_attr get{};
  get.pathname = reinterpret_cast<std::uintptr_t>(path.c_str());
  const long fd = bpfCall(BPF_OBJ_GET, get);
  if (fd < 0) return;
  bpf_attr detach{};
  detach.link_detach.link_fd = static_cast<std::uint32_t>(fd);
  (void)bpfCall(BPF_LINK_DETACH, detach);  // EINVAL for a map: nothing to detach
  ::close(static_cast<int>(fd));
}

core::Result<void> failed(const std::string& what, int errnum) {
  return core::makeError(core::ErrorCategory::kKernel, what, errnum);
}

}  // namespace

core::Result<bool> removeBpfPins(const std::string& dir) {
  DIR* listing = ::opendir(dir.c_str());
  if (listing == nullptr) {
    if (errno == ENOENT) return false;
    return std::unexpected(failed("listing the BPF pins in " + dir, errno).error());
  }
  std::vector<std::string> entries;
  while (const dirent* e = ::readdir(listing)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") entries.push_back(dir + "/" + name);
  }
  ::closedir(listing);
  // Links first: once they are detached, no socket meets the programs, whatever maps remain.
  for (const auto& path : entries) detachIfLink(path);
  for (const auto& path : entries)
    if (::unlink(path.c_str()) != 0 && errno != ENOENT)
      return std::unexpected(failed("removing the BPF pin " + path, errno).error());
  if (::rmdir(dir.c_str()) != 0 && errno != ENOENT)
    return std::unexpected(failed("removing the BPF pin directory " + dir, errno).error());
  return true;
}

}  // namespace kproxy::kernel
