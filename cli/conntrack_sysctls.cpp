#include "conntrack_sysctls.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <chrono>
#include <thread>

#include "kproxy/core/log.h"
#include "kproxy/kernel/sysctl.h"

namespace kproxy::cli {
namespace {

using core::ErrorCategory;
using core::makeError;

constexpr const char* kNetfilter = "net/netfilter/";

std::int64_t wholeSeconds(Duration d) {
  // Go's int(d / time.Second): truncates toward zero.
  return std::chrono::duration_cast<std::chrono::seconds>(d).count();
}

/// The integer in a sysctl file, or -1 when it cannot be read or parsed.
std::int64_t readInt(const kernel::SysctlFiles& files, const std::string& name) {
  auto value = files.readInt(name);
  return value ? *value : -1;
}

/// Writes the value; 0 or the errno. Never creates the file (a missing sysctl stays missing).
int writeInt(const kernel::SysctlFiles& files, const std::string& name, std::int64_t value) {
  auto written = files.writeInt(name, value);
  return written ? 0 : (written.error().errnum != 0 ? written.error().errnum : EIO);
}

bool isReadOnly(int err) {
  return err == EACCES || err == EPERM || err == EROFS || err == EOPNOTSUPP;
}

/// Upstream's setIntSysCtl: write only when the value differs.
core::Result<SysctlOutcome> setInt(const kernel::SysctlFiles& files, const std::string& name, std::int64_t value) {
  SysctlOutcome out;
  out.file = files.pathOf(name).string();
  out.value = value;
  out.previous = readInt(files, name);
  if (out.previous == value) {
    out.status = SysctlStatus::kUnchanged;
    return out;
  }
  int err = writeInt(files, name, value);
  out.errnum = err;
  if (err == 0) {
    out.status = SysctlStatus::kSet;
  } else if (err == ENOENT) {
    out.status = SysctlStatus::kMissing;
  } else if (isReadOnly(err)) {
    out.status = SysctlStatus::kReadOnly;
  } else {
    return makeError(ErrorCategory::kIo, "setting " + out.file + " to " + std::to_string(value), err);
  }
  return out;
}

}  // namespace

std::int64_t conntrackMax(const ConntrackConfig& config, int cores) {
  if (config.maxPerCore <= 0) return 0;
  std::int64_t scaled = static_cast<std::int64_t>(config.maxPerCore) * std::max(cores, 1);
  std::int64_t floor = std::max<std::int64_t>(config.min, 0);
  return scaled > floor ? scaled : floor;
}

std::vector<SysctlSetting> conntrackSysctls(const ConntrackConfig& config, int cores) {
  std::vector<SysctlSetting> out;
  auto add = [&out](const char* name, std::int64_t value) {
    out.push_back(SysctlSetting{std::string(kNetfilter) + name, value});
  };
  if (auto max = conntrackMax(config, cores); max > 0) add("nf_conntrack_max", max);
  if (auto s = wholeSeconds(config.tcpEstablishedTimeout); s > 0)
    add("nf_conntrack_tcp_timeout_established", s);
  if (auto s = wholeSeconds(config.tcpCloseWaitTimeout); s > 0)
    add("nf_conntrack_tcp_timeout_close_wait", s);
  if (config.tcpBeLiberal) add("nf_conntrack_tcp_be_liberal", 1);
  if (auto s = wholeSeconds(config.udpTimeout); s > 0) add("nf_conntrack_udp_timeout", s);
  if (auto s = wholeSeconds(config.udpStreamTimeout); s > 0) add("nf_conntrack_udp_timeout_stream", s);
  return out;
}

core::Result<std::vector<SysctlOutcome>> applyConntrackSysctls(const ConntrackConfig& config, int cores,
                                                               const SysctlRoots& roots) {
  std::vector<SysctlOutcome> outcomes;
  const kernel::SysctlFiles procSys(roots.procSys);
  const kernel::SysctlFiles moduleParameters(roots.moduleParameters);
  for (const auto& setting : conntrackSysctls(config, cores)) {
    auto outcome = setInt(procSys, setting.path, setting.value);
    if (!outcome) return std::unexpected(outcome.error());
    bool maxInPlace = setting.path == std::string(kNetfilter) + "nf_conntrack_max" &&
                      (outcome->status == SysctlStatus::kSet || outcome->status == SysctlStatus::kUnchanged);
    outcomes.push_back(std::move(*outcome));
    if (!maxInPlace) continue;
    // Upstream keeps the hash table at least a quarter of the maximum, and never shrinks it.
    const std::string hashsizeName = "hashsize";
    std::int64_t hashsize = readInt(moduleParameters, hashsizeName);
    std::int64_t wanted = setting.value / 4;
    if (hashsize >= wanted) continue;
    SysctlOutcome hs;
    hs.file = moduleParameters.pathOf(hashsizeName).string();
    hs.value = wanted;
    hs.previous = hashsize;
    if (hashsize < 0) {
      hs.status = SysctlStatus::kMissing;
      hs.errnum = ENOENT;
    } else if (int err = writeInt(moduleParameters, hashsizeName, wanted); err == 0) {
      hs.status = SysctlStatus::kSet;
    } else {
      // Only the initial network namespace may resize it, and /sys is often read-only in
      // containers: upstream only warns about that too.
      hs.status = err == ENOENT ? SysctlStatus::kMissing : SysctlStatus::kReadOnly;
      hs.errnum = err;
    }
    outcomes.push_back(std::move(hs));
  }
  return outcomes;
}

int onlineCpus() {
  long n = ::sysconf(_SC_NPROCESSORS_ONLN);
  if (n > 0) return static_cast<int>(n);
  unsigned hw = std::thread::hardware_concurrency();
  return hw > 0 ? static_cast<int>(hw) : 1;
}

core::Result<void> setUpConntrack(const ConntrackConfig& config, const SysctlRoots& roots) {
  int cores = onlineCpus();
  auto outcomes = applyConntrackSysctls(config, cores, roots);
  if (!outcomes) return std::unexpected(outcomes.error());
  for (const auto& o : *outcomes) {
    std::string value = std::to_string(o.value);
    std::string previous = std::to_string(o.previous);
    switch (o.status) {
      case SysctlStatus::kSet:
        log::info(0, "set sysctl", {{"entry", o.file}, {"value", value}, {"previous", previous}});
        break;
      case SysctlStatus::kUnchanged:
        log::info(2, "sysctl already set", {{"entry", o.file}, {"value", value}});
        break;
      case SysctlStatus::kReadOnly:
        log::warning("sysctl is read-only here, leaving it", {{"entry", o.file}, {"wanted", value},
                                                              {"current", previous},
                                                              {"error", std::strerror(o.errnum)}});
        break;
      case SysctlStatus::kMissing:
        log::warning("sysctl does not exist (nf_conntrack not loaded?), leaving it",
                     {{"entry", o.file}, {"wanted", value}});
        break;
    }
  }
  log::info(2, "conntrack sysctls applied", {{"cores", std::to_string(cores)},
                                             {"nf_conntrack_max", std::to_string(conntrackMax(config, cores))}});
  return {};
}

}  // namespace kproxy::cli
