#include "kproxy/userspace/endpoint_chooser.h"

#include <algorithm>

#include "kproxy/net/host_port.h"

namespace kproxy::userspace {

std::string Target::toString() const { return net::joinHostPort(ip, port); }

void EndpointChooser::setEndpoints(std::vector<Target> endpoints, std::chrono::seconds affinityTimeout) {
  endpoints_ = std::move(endpoints);
  if (!endpoints_.empty()) next_ %= endpoints_.size();
  affinityTimeout_ = affinityTimeout;
  if (!affinity()) {
    affinity_.clear();
    return;
  }
  std::erase_if(affinity_, [&](const auto& entry) {
    return std::find(endpoints_.begin(), endpoints_.end(), entry.second.target) == endpoints_.end();
  });
}

std::vector<Target> EndpointChooser::order(const std::string& client, TimePoint now, std::size_t maxAttempts) {
  std::vector<Target> out;
  if (endpoints_.empty() || maxAttempts == 0) return out;
  if (affinity()) {
    if (auto it = affinity_.find(client); it != affinity_.end()) {
      if (now - it->second.last <= affinityTimeout_)
        out.push_back(it->second.target);
      else
        affinity_.erase(it);
    }
  }
  const std::size_t n = endpoints_.size();
  const std::size_t start = next_;
  next_ = (next_ + 1) % n;
  for (std::size_t i = 0; i < n && out.size() < maxAttempts; ++i) {
    const Target& t = endpoints_[(start + i) % n];
    if (std::find(out.begin(), out.end(), t) == out.end()) out.push_back(t);
  }
  return out;
}

void EndpointChooser::served(const std::string& client, const Target& target, TimePoint now) {
  if (!affinity()) return;
  affinity_[client] = Sticky{target, now};
}

void EndpointChooser::expire(TimePoint now) {
  std::erase_if(affinity_, [&](const auto& entry) { return now - entry.second.last > affinityTimeout_; });
}

}  // namespace kproxy::userspace
