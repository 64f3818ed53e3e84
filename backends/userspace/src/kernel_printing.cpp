// --dry-run's listeners (kernel.h): what each update and retain changes, as comments beside
// the table's nft syntax (nftables' PrintingNftables), printed, then handed to the inner
// adapter.
#include "kproxy/userspace/kernel.h"

#include <utility>

#include <fmt/format.h>

namespace kproxy::userspace {
namespace {

/// "10.244.1.5:8080, 10.244.2.6:8080 (ClientIP affinity 10800s)", "(none)".
std::string poolText(const ListenerSpec& spec) {
  std::string pool;
  for (const auto& t : spec.endpoints) pool += (pool.empty() ? "" : ", ") + t.toString();
  if (pool.empty()) pool = "(none)";
  if (spec.affinityTimeout.count() > 0) pool += fmt::format(" (ClientIP affinity {}s)", spec.affinityTimeout.count());
  return pool;
}

}  // namespace

PrintingListeners::PrintingListeners(std::unique_ptr<ProxyListeners> inner, std::FILE* out)
    : inner_(std::move(inner)), out_(out) {}

core::Result<std::map<std::string, std::uint16_t>> PrintingListeners::update(const std::vector<ListenerSpec>& specs) {
  auto ports = inner_->update(specs);
  if (!ports) return ports;
  std::string text;
  for (const auto& spec : specs) {
    const std::uint16_t port = ports->at(spec.id);
    auto it = open_.find(spec.id);
    if (it == open_.end() || it->second.port != port) {
      text += fmt::format("# userspace: listen {} :{} -> {}\n", spec.id, port, poolText(spec));
    } else if (it->second.spec.endpoints != spec.endpoints ||
               it->second.spec.affinityTimeout != spec.affinityTimeout) {
      text += fmt::format("# userspace: pool of {} :{} -> {}\n", spec.id, port, poolText(spec));
    }
    open_[spec.id] = Open{spec, port};
  }
  std::fputs(text.c_str(), out_);
  std::fflush(out_);
  return ports;
}

void PrintingListeners::retain(const std::set<std::string>& keep) {
  for (auto it = open_.begin(); it != open_.end();) {
    if (keep.contains(it->first)) {
      ++it;
      continue;
    }
    fmt::print(out_, "# userspace: close {} :{}\n", it->first, it->second.port);
    it = open_.erase(it);
  }
  std::fflush(out_);
  inner_->retain(keep);
}

}  // namespace kproxy::userspace
