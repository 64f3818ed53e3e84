// A third-party backend that programs no kernel: it writes the node-local desired state (every
// service port of this node with its resolved endpoints, the node, the ServiceCIDRs) as one
// JSON document to a file, for another dataplane (an eBPF loader, a hardware offload agent) to
// consume. Each sync replaces the file atomically (write a temporary file, fsync, rename), so a
// reader never sees half a document, and a failed sync leaves the previous document in place,
// as the ABI asks of a sync.
//
// Where it writes: the option "json-file" if the host passes one, else the environment
// variable KPROXY_JSON_FILE. With --dry-run it writes nothing and prints the document on
// standard output instead.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <kproxy/plugin/sdk.h>

namespace {

namespace sdk = kproxy::sdk;

// ---- a minimal JSON writer: strings, arrays of strings, and objects assembled by hand ----

std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

std::string strings(const std::vector<std::string>& v) {
  std::string out = "[";
  for (std::size_t i = 0; i < v.size(); ++i) out += (i ? "," : "") + quoted(v[i]);
  return out + "]";
}

const char* boolean(bool b) { return b ? "true" : "false"; }

const char* familyName(sdk::Family f) { return f == sdk::Family::kIPv6 ? "IPv6" : "IPv4"; }

const char* typeName(sdk::ServiceType t) {
  switch (t) {
    case sdk::ServiceType::kClusterIP:
      return "ClusterIP";
    case sdk::ServiceType::kNodePort:
      return "NodePort";
    case sdk::ServiceType::kLoadBalancer:
      return "LoadBalancer";
  }
  return "ClusterIP";
}

const char* policyName(bool local) { return local ? "Local" : "Cluster"; }

std::string endpoints(const std::vector<sdk::Endpoint>& v) {
  std::string out = "[";
  for (std::size_t i = 0; i < v.size(); ++i) {
    const auto& e = v[i];
    out += std::string(i ? "," : "") + "{\"ip\":" + quoted(e.ip) +
           ",\"port\":" + std::to_string(e.port) + ",\"local\":" + boolean(e.isLocal) +
           ",\"ready\":" + boolean(e.ready) + ",\"serving\":" + boolean(e.serving) +
           ",\"terminating\":" + boolean(e.terminating) + ",\"nodeName\":" + quoted(e.nodeName) +
           ",\"zone\":" + quoted(e.zone) + "}";
  }
  return out + "]";
}

// One service port as one JSON object. The endpoint sets are the ones a dataplane programs:
// cluster-policy traffic picks from clusterEndpoints, local-policy traffic from localEndpoints;
// hasAnyEndpoints decides between rejecting and dropping when the set it needs is empty.
std::string servicePortJSON(const sdk::ServicePort& p) {
  return "{\"family\":" + quoted(familyName(p.family)) + ",\"key\":" + quoted(p.key) +
         ",\"namespace\":" + quoted(p.ns) + ",\"service\":" + quoted(p.serviceName) +
         ",\"portName\":" + quoted(p.portName) +
         ",\"protocol\":" + quoted(sdk::protocolName(p.protocol)) +
         ",\"type\":" + quoted(typeName(p.type)) + ",\"clusterIP\":" + quoted(p.clusterIP) +
         ",\"port\":" + std::to_string(p.port) + ",\"nodePort\":" + std::to_string(p.nodePort) +
         ",\"healthCheckNodePort\":" + std::to_string(p.healthCheckNodePort) +
         ",\"externalIPs\":" + strings(p.externalIPs) +
         ",\"loadBalancerIPs\":" + strings(p.loadBalancerIPs) +
         ",\"loadBalancerSourceRanges\":" + strings(p.loadBalancerSourceRanges) +
         ",\"externalTrafficPolicy\":" + quoted(policyName(p.externalPolicyLocal)) +
         ",\"internalTrafficPolicy\":" + quoted(policyName(p.internalPolicyLocal)) +
         ",\"sessionAffinityClientIP\":" + boolean(p.sessionAffinityClientIP) +
         ",\"stickyMaxAgeSeconds\":" + std::to_string(p.stickyMaxAgeSeconds) +
         ",\"hasAnyEndpoints\":" + boolean(p.hasAnyEndpoints) +
         ",\"clusterEndpoints\":" + endpoints(p.clusterEndpoints) +
         ",\"localEndpoints\":" + endpoints(p.localEndpoints) + "}";
}

// ---- the backend ----

using PortKey = std::pair<sdk::Family, std::string>;
using Rendered = std::map<PortKey, std::string>;  // sorted: the document's order is stable

class JsonBackend final : public sdk::BackendPlugin {
 public:
  JsonBackend(sdk::Host host, std::string path, bool dryRun, sdk::Metric ports, sdk::Metric writes)
      : host_(host), path_(std::move(path)), dryRun_(dryRun), ports_(ports), writes_(writes) {}

  sdk::Expected<sdk::SyncOutcome> sync(const sdk::SyncContext& ctx) override {
    // Work on a copy: if writing fails, what this backend believes is written stays true.
    Rendered next;
    std::uint64_t operations = 0;
    if (ctx.full || !ctx.previous.valid()) {
      ctx.next.forEach([&](const sdk::ServicePort& p) {
        next.emplace(PortKey{p.family, p.key}, servicePortJSON(p));
      });
      // Operations are what really changes (a self-verification must find 0): ports new,
      // changed or gone since the last write, or one rewrite of a file someone else changed.
      for (const auto& [key, json] : next) {
        auto it = rendered_.find(key);
        if (it == rendered_.end() || it->second != json) ++operations;
      }
      for (const auto& [key, json] : rendered_) operations += next.contains(key) ? 0 : 1;
    } else {
      next = rendered_;
      for (const auto& changed : ctx.changed) {
        PortKey key{changed.family, changed.key};
        if (auto port = ctx.next.find(changed.family, changed.key)) {
          next[key] = servicePortJSON(*port);
        } else {
          next.erase(key);
        }
        ++operations;
      }
    }
    const std::string text = document(ctx.next, next);
    if (ctx.full && operations == 0 && !dryRun_ && readFile() != text) operations = 1;
    if (dryRun_) {
      std::fwrite(text.data(), 1, text.size(), stdout);
      std::fflush(stdout);
    } else if (auto written = replaceFile(text); !written) {
      return std::unexpected(written.error());
    }
    rendered_ = std::move(next);
    ports_.set(static_cast<double>(rendered_.size()));
    writes_.add(1);
    host_.info(2, "json: wrote " + std::to_string(rendered_.size()) + " service ports to " +
                      (dryRun_ ? std::string("stdout") : path_));
    return sdk::SyncOutcome{operations, (ctx.full ? "full " : "partial ") +
                                            std::to_string(rendered_.size()) + " service ports"};
  }

  sdk::Expected<void> cleanup() override {
    if (dryRun_ || path_.empty()) return {};
    if (::unlink(path_.c_str()) != 0 && errno != ENOENT) {
      return sdk::fail(sdk::kernelErrorCategory(errno),
                       "json: remove " + path_ + ": " + std::strerror(errno), errno);
    }
    rendered_.clear();
    return {};
  }

  // A JSON file programs no packets; the answer names what a dataplane reading the file gets
  // for this destination: the service port and the endpoints it would choose from.
  sdk::Expected<std::string> explain(const sdk::SnapshotView& snapshot,
                                     const sdk::ExplainRequest& request) override {
    std::optional<sdk::ServicePort> hit;
    snapshot.forEach([&](const sdk::ServicePort& p) {
      if (p.family == request.family && p.protocol == request.protocol &&
          p.clusterIP == request.destinationIP && p.port == request.destinationPort)
        hit = p;
    });
    if (request.json) {
      return std::string("{\"backend\":\"json\",\"servicePort\":") +
             (hit ? servicePortJSON(*hit) : std::string("null")) + "}\n";
    }
    if (!hit) return std::string("json: no service port answers on this address\n");
    std::string out = "json: " + hit->key + " (" + hit->clusterIP + ":" +
                      std::to_string(hit->port) + "), cluster endpoints:";
    for (const auto& e : hit->clusterEndpoints) out += " " + e.ip + ":" + std::to_string(e.port);
    return out + "\n";
  }

 private:
  static std::string document(const sdk::SnapshotView& snapshot, const Rendered& ports) {
    const sdk::NodeInfo node = snapshot.node();
    std::string out = "{\"node\":{\"name\":" + quoted(node.name) +
                      ",\"addresses\":" + strings(node.addresses) +
                      ",\"podCIDRs\":" + strings(node.podCIDRs) + "},\"serviceCIDRs\":[";
    bool first = true;
    for (const auto& c : snapshot.serviceCIDRs()) {
      out += std::string(first ? "" : ",") + "{\"name\":" + quoted(c.name) +
             ",\"cidr\":" + quoted(c.cidr) + "}";
      first = false;
    }
    out += "],\"servicePorts\":[";
    first = true;
    for (const auto& [key, json] : ports) {
      out += (first ? "\n" : ",\n") + json;
      first = false;
    }
    return out + "]}\n";
  }

  // Writes `text` to a temporary file beside the target, flushes it to disk and renames it
  // over the target: readers see the old document or the new one, never a mix.
  std::string readFile() const {
    std::ifstream in(path_, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }

  sdk::Expected<void> replaceFile(const std::string& text) const {
    const std::string tmp = path_ + ".tmp";
    auto failed = [&](const std::string& what) {
      const int err = errno;
      ::unlink(tmp.c_str());
      return sdk::fail(sdk::kernelErrorCategory(err), "json: " + what + ": " + std::strerror(err),
                       err);
    };
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return failed("create " + tmp);
    std::size_t done = 0;
    while (done < text.size()) {
      const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        auto error = failed("write " + tmp);
        ::close(fd);
        return error;
      }
      done += static_cast<std::size_t>(n);
    }
    if (::fsync(fd) != 0) {
      auto error = failed("fsync " + tmp);
      ::close(fd);
      return error;
    }
    if (::close(fd) != 0) return failed("close " + tmp);
    if (::rename(tmp.c_str(), path_.c_str()) != 0) return failed("rename " + tmp + " to " + path_);
    return {};
  }

  sdk::Host host_;
  std::string path_;
  bool dryRun_;
  sdk::Metric ports_;
  sdk::Metric writes_;
  Rendered rendered_;  // what the file holds now
};

sdk::Expected<std::unique_ptr<sdk::BackendPlugin>> makeJsonBackend(const sdk::Host& host,
                                                                   const sdk::Options& options) {
  const auto option = [&](const char* key) -> std::string {
    auto it = options.find(key);
    return it != options.end() ? it->second : std::string();
  };
  const bool dryRun = option("dry-run") == "true";
  std::string path = option("json-file");
  if (path.empty()) {
    const char* env = std::getenv("KPROXY_JSON_FILE");
    path = env != nullptr ? env : "";
  }
  if (path.empty() && !dryRun) {
    return sdk::fail(sdk::ErrorCategory::kInvalidInput,
                     "json: no output file: set KPROXY_JSON_FILE (or the option json-file)",
                     EINVAL);
  }
  auto ports =
      host.gauge("kproxy_json_service_ports", "Service ports in the last JSON document written");
  if (!ports) return std::unexpected(ports.error());
  auto writes = host.counter("kproxy_json_writes_total", "JSON documents written");
  if (!writes) return std::unexpected(writes.error());
  return std::make_unique<JsonBackend>(host, std::move(path), dryRun, *ports, *writes);
}

}  // namespace

KPROXY_DEFINE_PLUGIN("json", "1.0", "writes the node-local desired state as JSON to a file",
                     makeJsonBackend)
