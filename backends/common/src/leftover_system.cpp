#include "kproxy/backends/common/leftover_system.h"

#include <linux/netfilter.h>
#include <linux/netlink.h>

#include <chrono>
#include <filesystem>

#include "kproxy/kernel/bpf_pins.h"
#include "kproxy/kernel/netlink_socket.h"
#include "kproxy/kernel/nftables_table.h"
#include "kproxy/kernel/process.h"

namespace kproxy::backends {

namespace {
// No tool the cleanup runs should take more than seconds; a hung one must not hang --cleanup or
// the start-up.
constexpr std::chrono::seconds kCommandTimeout{60};
}  // namespace

std::optional<std::string> RealLeftoverSystem::findTool(std::string_view name) { return kernel::findExecutable(name); }

bool RealLeftoverSystem::pathExists(const std::string& path) {
  std::error_code ec;
  return std::filesystem::exists(path, ec);
}

core::Result<bool> RealLeftoverSystem::deleteNftablesTable(std::string_view family, std::string_view name) {
  auto socket = kernel::NetlinkSocket::open(NETLINK_NETFILTER);
  if (!socket) return std::unexpected(socket.error());
  return kernel::deleteNftablesTable(*socket, family == "ip6" ? NFPROTO_IPV6 : NFPROTO_IPV4, name);
}

core::Result<bool> RealLeftoverSystem::removeBpfPins(const std::string& dir) { return kernel::removeBpfPins(dir); }

core::Result<CommandResult> RealLeftoverSystem::query(const std::vector<std::string>& argv) {
  return change(argv, {});
}

core::Result<CommandResult> RealLeftoverSystem::change(const std::vector<std::string>& argv, std::string_view input) {
  auto ran = kernel::runProcess(argv, {.stdinData = input, .timeout = kCommandTimeout});
  if (!ran) return std::unexpected(ran.error());
  return CommandResult{ran->exitCode, std::move(ran->out), std::move(ran->err)};
}

core::Result<CommandResult> PrintingLeftoverSystem::change(const std::vector<std::string>& argv,
                                                           std::string_view input) {
  std::string line;
  for (const auto& a : argv) line += (line.empty() ? "" : " ") + a;
  std::fprintf(out_, "%s\n", line.c_str());
  if (!input.empty()) {
    std::fwrite(input.data(), 1, input.size(), out_);
    if (input.back() != '\n') std::fputc('\n', out_);
  }
  std::fflush(out_);
  return CommandResult{};
}

core::Result<bool> PrintingLeftoverSystem::deleteNftablesTable(std::string_view family, std::string_view name) {
  std::fprintf(out_, "nft delete table %.*s %.*s\n", static_cast<int>(family.size()), family.data(),
               static_cast<int>(name.size()), name.data());
  std::fflush(out_);
  return false;
}

core::Result<bool> PrintingLeftoverSystem::removeBpfPins(const std::string& dir) {
  if (!system_.pathExists(dir)) return false;
  std::fprintf(out_, "remove bpf pins %s\n", dir.c_str());
  std::fflush(out_);
  return false;
}

std::string firstLine(std::string_view text) {
  while (!text.empty() && (text.front() == '\n' || text.front() == ' ')) text.remove_prefix(1);
  return std::string(text.substr(0, text.find('\n')));
}

std::string joinNames(const std::vector<std::string>& names, std::size_t limit) {
  std::string out;
  for (std::size_t i = 0; i < names.size() && i < limit; ++i) {
    if (!out.empty()) out += ",";
    out += names[i];
  }
  if (names.size() > limit) out += ",...";
  return out;
}

}  // namespace kproxy::backends
