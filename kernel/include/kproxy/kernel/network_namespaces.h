#pragma once
/// The network namespaces that the processes of a cgroup are in, held open, and work run inside
/// each of them by a thread of its own, so that the caller's thread never leaves its namespace.
/// The ebpf backend walks the sockets of a cgroup's namespaces this way: a BPF socket iterator
/// walks the namespace it is created in.
/// Thread-safety: the functions are; a NetworkNamespace is a value.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kproxy/kernel/file_descriptor.h"

namespace kproxy::kernel {

struct NetworkNamespace {
  FileDescriptor file;      ///< the namespace's file, open: the namespace lives while it is held
  std::uint64_t inode = 0;  ///< the namespace's inode (nsfs), which tells namespaces apart
  std::string path;         ///< where it was opened ("/proc/4242/ns/net"), for messages
};

/// One per network namespace that a process in `cgroup` (a cgroup v2 directory) or below it is
/// in, in the order met, each opened once. A process that exits meanwhile is skipped; an
/// unreadable directory is skipped too (nothing is an error: what is found is returned).
std::vector<NetworkNamespace> networkNamespacesOfCgroup(const std::string& cgroup);

/// Runs `work(i)` inside each of `namespaceFds[i]` in turn, on one thread of its own that
/// joins each (setns) and ends in the last. Returns, per namespace, 0, the errno of joining it
/// (`work` was not run there), or what `work` returned. One namespace's failure does not stop
/// the others.
std::vector<int> inEachNetworkNamespace(const std::vector<int>& namespaceFds, const std::function<int(std::size_t)>& work);

}  // namespace kproxy::kernel
