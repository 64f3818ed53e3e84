#include "file_trust.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <system_error>

namespace kproxy::plugins::detail {

std::vector<uid_t> trustedOwners() {
  std::vector<uid_t> owners{0, ::geteuid()};
  struct stat exe {};
  if (::stat("/proc/self/exe", &exe) == 0) owners.push_back(exe.st_uid);
  std::sort(owners.begin(), owners.end());
  owners.erase(std::unique(owners.begin(), owners.end()), owners.end());
  return owners;
}

core::Result<void> checkTrustedPath(const std::filesystem::path& path, const std::vector<uid_t>& owners) {
  std::error_code ec;
  std::filesystem::path resolved = std::filesystem::canonical(path, ec);
  if (ec)
    return core::makeError(core::ErrorCategory::kNotFound, path.string() + ": " + ec.message(), ec.value());
  auto required = [&] {
    std::string uids;
    for (uid_t uid : owners) uids += (uids.empty() ? "" : " or ") + std::to_string(uid);
    return "plugins and the directories above them must be owned by uid " + uids +
           " and writable only by their owner";
  };
  for (std::filesystem::path p = resolved;; p = p.parent_path()) {
    struct stat st {};
    if (::lstat(p.c_str(), &st) != 0)
      return core::makeError(core::ErrorCategory::kIo, p.string() + ": cannot stat", errno);
    if (std::find(owners.begin(), owners.end(), st.st_uid) == owners.end())
      return core::makeError(core::ErrorCategory::kPlugin,
                             p.string() + " is owned by uid " + std::to_string(st.st_uid) + "; " + required());
    const bool stickyDir = S_ISDIR(st.st_mode) && (st.st_mode & S_ISVTX) != 0;
    if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0 && !stickyDir) {
      char mode[8];
      std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
      return core::makeError(core::ErrorCategory::kPlugin,
                             p.string() + " is writable by group or others (mode " + mode + "); " + required());
    }
    if (p == p.root_path() || p.parent_path() == p) break;
  }
  return {};
}

}  // namespace kproxy::plugins::detail
