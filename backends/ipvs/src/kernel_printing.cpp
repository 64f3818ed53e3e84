// --dry-run's kernel interfaces (kernel.h): each change printed as the command that would make
// it, then handed to the inner adapter.
#include <utility>

#include <fmt/format.h>

#include "kproxy/ipvs/backend.h"
#include "kproxy/ipvs/kernel.h"

namespace kproxy::ipvs {
namespace {

void printLine(std::FILE* out, const std::string& line) {
  fmt::print(out, "{}\n", line);
  std::fflush(out);
}

}  // namespace

PrintingIpvs::PrintingIpvs(std::unique_ptr<KernelIpvs> inner, std::FILE* out) : inner_(std::move(inner)), out_(out) {}

core::Result<void> PrintingIpvs::addVirtualServer(const VirtualServer& vs) {
  printLine(out_, ipvsadmCommand('A', vs));
  return inner_->addVirtualServer(vs);
}

core::Result<void> PrintingIpvs::updateVirtualServer(const VirtualServer& vs) {
  printLine(out_, ipvsadmCommand('E', vs));
  return inner_->updateVirtualServer(vs);
}

core::Result<void> PrintingIpvs::deleteVirtualServer(const VirtualServer& vs) {
  printLine(out_, ipvsadmCommand('D', vs));
  return inner_->deleteVirtualServer(vs);
}

core::Result<void> PrintingIpvs::addRealServer(const VirtualServer& vs, const RealServer& rs) {
  printLine(out_, ipvsadmCommand('a', vs, &rs));
  return inner_->addRealServer(vs, rs);
}

core::Result<void> PrintingIpvs::updateRealServer(const VirtualServer& vs, const RealServer& rs) {
  printLine(out_, ipvsadmCommand('e', vs, &rs));
  return inner_->updateRealServer(vs, rs);
}

core::Result<void> PrintingIpvs::deleteRealServer(const VirtualServer& vs, const RealServer& rs) {
  printLine(out_, ipvsadmCommand('d', vs, &rs));
  return inner_->deleteRealServer(vs, rs);
}

core::Result<void> PrintingIpvs::flush() {
  printLine(out_, "ipvsadm -C");
  return inner_->flush();
}

core::Result<void> PrintingIpvs::setTimeouts(const Timeouts& t) {
  printLine(out_, fmt::format("ipvsadm --set {} {} {}", t.tcp, t.tcpFin, t.udp));
  return inner_->setTimeouts(t);
}

PrintingDummyLink::PrintingDummyLink(std::unique_ptr<KernelDummyLink> inner, std::FILE* out)
    : inner_(std::move(inner)), out_(out) {}

core::Result<bool> PrintingDummyLink::ensureLink(const std::string& name) {
  // Whether the link exists is the inner's to say: only a link that is created is printed.
  auto existed = inner_->ensureLink(name);
  if (existed && !*existed) printLine(out_, fmt::format("ip link add {} type dummy", name));
  return existed;
}

core::Result<void> PrintingDummyLink::deleteLink(const std::string& name) {
  printLine(out_, fmt::format("ip link del {}", name));
  return inner_->deleteLink(name);
}

core::Result<void> PrintingDummyLink::addAddress(const std::string& name, const net::Prefix& address) {
  printLine(out_, ipAddrCommand("add", name, address));
  return inner_->addAddress(name, address);
}

core::Result<void> PrintingDummyLink::deleteAddress(const std::string& name, const net::Prefix& address) {
  printLine(out_, ipAddrCommand("del", name, address));
  return inner_->deleteAddress(name, address);
}

PrintingIpsets::PrintingIpsets(std::unique_ptr<KernelIpsets> inner, std::FILE* out)
    : inner_(std::move(inner)), out_(out) {}

core::Result<void> PrintingIpsets::restore(std::string_view input) {
  if (input.empty()) return inner_->restore(input);
  fmt::print(out_, "# ipset restore -exist\n{}{}", input, input.ends_with('\n') ? "" : "\n");
  std::fflush(out_);
  return inner_->restore(input);
}

}  // namespace kproxy::ipvs
