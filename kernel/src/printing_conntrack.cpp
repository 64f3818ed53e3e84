// PrintingConntrackTable: --dry-run's conntrack table, each deletion printed as the conntrack(8)
// command that would make it (the original tuple, as the kernel matches it), and not made.
#include <string>

#include "kproxy/kernel/conntrack_table.h"

namespace kproxy::kernel {

core::Result<std::size_t> PrintingConntrackTable::remove(const std::vector<ConntrackFlow>& flows) {
  for (const auto& f : flows) {
    const char* protocol = f.protocol == core::Protocol::kUDP ? "udp" : f.protocol == core::Protocol::kSCTP ? "sctp" : "tcp";
    std::string line = "conntrack -D -f ";
    line += f.family == net::Family::kIPv6 ? "ipv6" : "ipv4";
    line += " -p ";
    line += protocol;
    line += " -s " + f.original.srcIP + " --sport " + std::to_string(f.original.srcPort);
    line += " -d " + f.original.dstIP + " --dport " + std::to_string(f.original.dstPort);
    if (f.zone != 0) line += " -w " + std::to_string(f.zone);
    std::fprintf(out_, "%s\n", line.c_str());
  }
  std::fflush(out_);
  return flows.size();
}

}  // namespace kproxy::kernel
