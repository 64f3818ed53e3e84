// networkNamespacesOfCgroup and inEachNetworkNamespace (network_namespaces.h).
#include "kproxy/kernel/network_namespaces.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/stat.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>
#include <utility>

namespace kproxy::kernel {

std::vector<NetworkNamespace> networkNamespacesOfCgroup(const std::string& cgroup) {
  namespace fs = std::filesystem;
  std::vector<NetworkNamespace> out;
  std::set<std::pair<dev_t, ino_t>> seen;
  auto addProcesses = [&](const fs::path& dir) {
    std::ifstream procs(dir / "cgroup.procs");
    for (long pid = 0; procs >> pid;) {
      if (pid <= 0) continue;
      // Most processes share a few namespaces: each is opened once. The identity is taken
      // from the open file, so that it is the namespace held even if the process exits.
      std::string path = "/proc/" + std::to_string(pid) + "/ns/net";
      FileDescriptor file(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
      struct stat st{};
      if (!file || ::fstat(file.get(), &st) != 0 || !seen.emplace(st.st_dev, st.st_ino).second) continue;
      out.push_back(NetworkNamespace{std::move(file), static_cast<std::uint64_t>(st.st_ino), std::move(path)});
    }
  };
  addProcesses(cgroup);
  std::error_code ec;
  for (fs::recursive_directory_iterator it(cgroup, fs::directory_options::skip_permission_denied, ec), end;
       !ec && it != end; it.increment(ec))
    if (it->is_directory(ec)) addProcesses(it->path());
  return out;
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
