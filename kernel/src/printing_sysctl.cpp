// PrintingSysctls: --dry-run's sysctls, each write printed as the sysctl(8) command that would
// make it, then handed to the inner adapter.
#include <cinttypes>

#include "kproxy/kernel/sysctl.h"

namespace kproxy::kernel {

core::Result<void> PrintingSysctls::writeInt(const std::string& name, std::int64_t value) {
  std::string dotted = name;
  for (char& c : dotted)
    if (c == '/') c = '.';
  std::fprintf(out_, "sysctl -w %s=%" PRId64 "\n", dotted.c_str(), value);
  std::fflush(out_);
  return inner_->writeInt(name, value);
}

}  // namespace kproxy::kernel
