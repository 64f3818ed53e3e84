#include "explain_args.h"

#include <arpa/inet.h>

#include <charconv>
#include <string_view>

#include "flags.h"

namespace kproxy::cli {
namespace {

using core::ErrorCategory;
using core::makeError;

std::optional<net::Family> familyOf(const std::string& ip) {
  unsigned char buf[16];
  if (inet_pton(AF_INET, ip.c_str(), buf) == 1) return net::Family::kIPv4;
  if (inet_pton(AF_INET6, ip.c_str(), buf) == 1) return net::Family::kIPv6;
  return std::nullopt;
}

core::Result<void> parseDestination(std::string_view text, plugins::ExplainRequest& r) {
  auto bad = [&](std::string_view why) {
    return makeError(ErrorCategory::kInvalidArgument,
                     "explain: bad destination \"" + std::string(text) + "\": " + std::string(why) +
                         " (want IP:PORT[/tcp|udp|sctp], [IPv6]:PORT for IPv6)");
  };
  std::string_view rest = text;
  if (auto slash = rest.rfind('/'); slash != std::string_view::npos) {
    std::string_view proto = rest.substr(slash + 1);
    if (proto == "tcp") r.protocol = core::Protocol::kTCP;
    else if (proto == "udp") r.protocol = core::Protocol::kUDP;
    else if (proto == "sctp") r.protocol = core::Protocol::kSCTP;
    else return bad("unknown protocol \"" + std::string(proto) + "\"");
    rest = rest.substr(0, slash);
  }
  std::string_view host, port;
  if (rest.starts_with("[")) {
    auto close = rest.find("]:");
    if (close == std::string_view::npos) return bad("no port after the bracketed address");
    host = rest.substr(1, close - 1);
    port = rest.substr(close + 2);
  } else {
    auto colon = rest.rfind(':');
    if (colon == std::string_view::npos) return bad("no port");
    host = rest.substr(0, colon);
    port = rest.substr(colon + 1);
    if (host.find(':') != std::string_view::npos) return bad("write an IPv6 address in brackets");
  }
  unsigned value = 0;
  auto [ptr, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
  if (port.empty() || ec != std::errc{} || ptr != port.data() + port.size() || value == 0 ||
      value > 65535) {
    return bad("port must be 1-65535");
  }
  r.destinationIP = std::string(host);
  r.destinationPort = static_cast<std::uint16_t>(value);
  auto family = familyOf(r.destinationIP);
  if (!family) return bad("not an IP address");
  r.family = *family;
  return {};
}

}  // namespace

core::Result<ExplainCommand> parseExplainCommand(std::span<const char* const> args) {
  ExplainCommand cmd;
  std::vector<std::string_view> positional;
  for (std::size_t i = 0; i < args.size(); ++i) {
    std::string_view arg = args[i] != nullptr ? args[i] : "";
    if (arg == "-h" || arg == "--help") {
      cmd.showHelp = true;
    } else if (arg == "--from-node" || arg == "--from-node=true") {
      cmd.request.fromNode = true;
    } else if (arg == "--from-node=false") {
      cmd.request.fromNode = false;
    } else if (arg == "--json" || arg == "--json=true") {
      cmd.request.json = true;
    } else if (arg == "--json=false") {
      cmd.request.json = false;
    } else if (arg == "--iif") {
      if (i + 1 >= args.size()) {
        return makeError(ErrorCategory::kInvalidArgument, "flag needs an argument: --iif");
      }
      cmd.request.inputInterface = args[++i];
    } else if (arg.starts_with("--iif=")) {
      cmd.request.inputInterface = std::string(arg.substr(6));
    } else if (arg.starts_with("-") && arg.size() > 1) {
      cmd.flags.push_back(args[i]);
      if (flagTakesNextArgument(arg) && i + 1 < args.size()) cmd.flags.push_back(args[++i]);
    } else {
      positional.push_back(arg);
    }
  }
  if (cmd.showHelp) return cmd;
  if (positional.size() != 2) {
    return makeError(ErrorCategory::kInvalidArgument,
                     "explain: want a source address and a destination IP:PORT[/protocol], got " +
                         std::to_string(positional.size()) + " arguments");
  }
  cmd.request.sourceIP = std::string(positional[0]);
  auto sourceFamily = familyOf(cmd.request.sourceIP);
  if (!sourceFamily) {
    return makeError(ErrorCategory::kInvalidArgument,
                     "explain: bad source \"" + cmd.request.sourceIP + "\": not an IP address");
  }
  if (auto d = parseDestination(positional[1], cmd.request); !d) return std::unexpected(d.error());
  if (*sourceFamily != cmd.request.family) {
    return makeError(ErrorCategory::kInvalidArgument,
                     "explain: source " + cmd.request.sourceIP + " and destination " +
                         cmd.request.destinationIP + " are of different IP families");
  }
  if (cmd.request.fromNode && !cmd.request.inputInterface.empty()) {
    return makeError(ErrorCategory::kInvalidArgument,
                     "explain: --iif names the interface an arriving packet came in on; it "
                     "cannot be given with --from-node");
  }
  return cmd;
}

std::string explainUsage() {
  return "Usage: kproxy explain SRC DST:PORT[/tcp|udp|sctp] [--from-node] [--iif NAME] [--json]\n"
         "                      [--manifests DIR | --kubeconfig FILE | --master URL] [flags]\n"
         "\n"
         "Says where the first packet of a new connection from SRC to DST:PORT would go under the\n"
         "rules the --proxy-mode backend would program for the current Services and\n"
         "EndpointSlices: the service port it hits, each endpoint in or out and why, DNAT, drop or\n"
         "reject, masquerade, and the rule-by-rule trace. Reads the objects once, touches no\n"
         "kernel. IPv6 destinations are written [fd00::1]:80.\n"
         "\n"
         "  --from-node   the packet is sent by a process on the node (default: it arrives)\n"
         "  --iif NAME    the interface an arriving packet comes in on\n"
         "  --json        print one JSON object\n"
         "\n"
         "Every kproxy flag applies (--proxy-mode, --config, --hostname-override, --cluster-cidr,\n"
         "--detect-local-mode, --masquerade-all, --plugin-dir, ...); see kproxy --help.\n";
}

}  // namespace kproxy::cli
