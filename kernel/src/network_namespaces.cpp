// NetworkNamespaces and inEachNetworkNamespace (network_namespaces.h).
#include "kproxy/kernel/network_namespaces.h"

#include <fcntl.h>
#include <linux/nsfs.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/stat.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <thread>

namespace kproxy::kernel {

bool NetworkNamespaces::add(const std::string& path) {
  FileDescriptor file(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK));
  // The identity is the open file's, so that it is the namespace held even if the process or
  // the mount goes meanwhile; the type, so that no other file (or namespace) passes for one.
  struct stat st{};
  if (!file || ::fstat(file.get(), &st) != 0 || ::ioctl(file.get(), NS_GET_NSTYPE) != CLONE_NEWNET) return false;
  if (seen_.emplace(st.st_dev, st.st_ino).second)
    list_.push_back(NetworkNamespace{std::move(file), static_cast<std::uint64_t>(st.st_ino), path});
  return true;
}

void NetworkNamespaces::addCgroup(const std::string& cgroup) {
  namespace fs = std::filesystem;
  auto addProcesses = [&](const fs::path& dir) {
    std::ifstream procs(dir / "cgroup.procs");
    for (long pid = 0; procs >> pid;)
      if (pid > 0) add("/proc/" + std::to_string(pid) + "/ns/net");
  };
  addProcesses(cgroup);
  std::error_code ec;
  for (fs::recursive_directory_iterator it(cgroup, fs::directory_options::skip_permission_denied, ec), end;
       !ec && it != end; it.increment(ec))
    if (it->is_directory(ec)) addProcesses(it->path());
}

void NetworkNamespaces::addDirectory(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (fs::directory_iterator it(dir, fs::directory_options::skip_permission_denied, ec), end; !ec && it != end;
       it.increment(ec))
    if (it->is_regular_file(ec)) add(it->path().string());
}

std::vector<int> inEachNetworkNamespace(const std::vector<int>& namespaceFds,
                                        const std::function<int(std::size_t)>& work) {
  std::vector<int> errors(namespaceFds.size(), 0);
  if (namespaceFds.empty()) return errors;
  // The thread ends in whichever namespace it joined last, and takes it along.
  std::thread([&] {
    for (std::size_t i = 0; i < namespaceFds.size(); ++i)
      errors[i] = ::setns(namespaceFds[i], CLONE_NEWNET) != 0 ? errno : work(i);
  }).join();
  return errors;
}

}  // namespace kproxy::kernel
