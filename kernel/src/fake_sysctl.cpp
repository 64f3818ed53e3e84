// FakeSysctls: kernel parameters in memory, with the files' errors for a missing one.
#include <cerrno>

#include "kproxy/kernel/sysctl.h"

namespace kproxy::kernel {

core::Result<std::int64_t> FakeSysctls::readInt(const std::string& name) {
  auto it = values.find(name);
  if (it == values.end())
    return core::makeError(core::ErrorCategory::kIo, "reading /proc/sys/" + name + " (fake)", ENOENT);
  return it->second;
}

core::Result<void> FakeSysctls::writeInt(const std::string& name, std::int64_t value) {
  auto it = values.find(name);
  if (it == values.end())
    return core::makeError(core::ErrorCategory::kIo,
                           "writing " + std::to_string(value) + " to /proc/sys/" + name + " (fake)", ENOENT);
  ++writes;
  it->second = value;
  return {};
}

}  // namespace kproxy::kernel
