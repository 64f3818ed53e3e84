// PrintingIptables: --dry-run's kernel interface (kernel.h).
#include <utility>

#include "kproxy/iptables/kernel.h"
#include "tool_errors.h"

namespace kproxy::iptables {

PrintingIptables::PrintingIptables(std::unique_ptr<KernelIptables> inner, std::FILE* out, std::string name)
    : inner_(std::move(inner)), out_(out), name_(std::move(name)) {}

core::Result<void> PrintingIptables::restore(net::Family family, std::string_view input) {
  if (input.empty()) return {};
  fmt::print(out_, "# {}-restore --noflush\n{}", toolName(family), input);
  std::fflush(out_);
  return inner_->restore(family, input);
}

}  // namespace kproxy::iptables
