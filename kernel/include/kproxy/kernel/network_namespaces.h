#pragma once
/// Network namespaces gathered from where a node keeps them, each held open once, and work run
/// inside each of them by a thread of its own, so that the caller's thread never leaves its
/// namespace. The ebpf backend walks the sockets of its pods' namespaces this way: a BPF socket
/// iterator walks the namespace it is created in.
/// Thread-safety: inEachNetworkNamespace is; a NetworkNamespaces is one thread's.

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "kproxy/kernel/file_descriptor.h"

namespace kproxy::kernel {

struct NetworkNamespace {
  FileDescriptor file;      ///< the namespace's file, open: the namespace lives while it is held
  std::uint64_t inode = 0;  ///< the namespace's inode (nsfs), which tells namespaces apart
  std::string path;         ///< where it was opened ("/proc/4242/ns/net"), for messages
};

/// Namespaces in the order found, each once (by its device and inode). Nothing here is an
/// error: what cannot be read is passed over, and what is found is kept.
class NetworkNamespaces {
 public:
  /// The namespace of each process in `cgroup` (a cgroup v2 directory) or below it, through
  /// /proc/PID/ns/net. A process that exits meanwhile is passed over, and so is one this
  /// process's PID namespace does not show (its cgroup.procs lists it as 0).
  void addCgroup(const std::string& cgroup);
  /// Each network namespace file directly in `dir`, as `ip netns add` and the container
  /// runtimes' CNI setups bind-mount them (/run/netns, /var/run/netns). Other files are passed
  /// over.
  void addDirectory(const std::string& dir);
  /// The network namespace of the file at `path` (/proc/self/ns/net: this process's own).
  /// Whether it was one, new or already held.
  bool add(const std::string& path);

  const std::vector<NetworkNamespace>& list() const { return list_; }
  std::vector<NetworkNamespace> take() { return std::move(list_); }

 private:
  std::vector<NetworkNamespace> list_;
  std::set<std::pair<dev_t, ino_t>> seen_;
};

/// Runs `work(i)` inside each of `namespaceFds[i]` in turn, on one thread of its own that
/// joins each (setns) and ends in the last. Returns, per namespace, 0, the errno of joining it
/// (`work` was not run there), or what `work` returned. One namespace's failure does not stop
/// the others.
std::vector<int> inEachNetworkNamespace(const std::vector<int>& namespaceFds,
                                        const std::function<int(std::size_t)>& work);

}  // namespace kproxy::kernel
