#pragma once
/// KernelMaps: the only way the ebpf backend reaches the kernel. The real adapter
/// (kernel_libbpf.cpp) loads the BPF programs from their libbpf skeleton, pins the maps and the
/// cgroup links under the pin path and reads and writes map elements; an in-memory fake sits
/// beside it for unit tests (fake_kernel.cpp), and --dry-run's printer over that fake
/// (kernel_printing.cpp).
///
/// Thread-safety: one call at a time.

#include <cerrno>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kproxy/core/error.h"
#include "kproxy/ebpf/maps.h"

namespace kproxy::ebpf {

/// Elements of the two maps the data path writes (kernel.h's readBack covers the plugin's).
struct DataPathCounts {
  std::size_t affinity = 0;  ///< kproxy_affinity: clients kept on an endpoint
  std::size_t reverse = 0;   ///< kproxy_reverse: sockets steered, for recvmsg and getpeername
  bool operator==(const DataPathCounts&) const = default;
};

/// A connected UDP socket that the connect hook steered to an endpoint: its reverse element
/// names it (the stale-socket passes, kproxy_sock.bpf.c's iter/udp programs).
struct SteeredSocket {
  std::uint64_t cookie = 0;  ///< the kernel's socket cookie
  SocketAddress local;       ///< the socket's own address and port
  SocketAddress service;     ///< what it connected to
  SocketAddress endpoint;    ///< what it is connected to
  std::uint64_t netns = 0;   ///< its network namespace (the nsfs inode) as listed; 0 unknown
  auto operator<=>(const SteeredSocket&) const = default;
  /// "cookie=4097 10.200.0.1:40000 -> 10.96.0.10:53 (10.200.0.2:5353)".
  std::string toText() const;
};

/// What KernelMaps::listSteeredSockets found.
struct SteeredSocketListing {
  std::vector<SteeredSocket> sockets;
  /// Network namespaces that could not be walked, by the listing or by an ending pass over it,
  /// one line each ("/proc/4242/ns/net: creating a socket iterator: Invalid argument"). Their
  /// sockets are left as they are; every other namespace's are listed and ended.
  std::vector<std::string> skipped;
  /// What the adapter keeps for endSockets, released with the listing. The real one keeps the
  /// namespaces it walked, open, so that an ending pass walks only those that hold a socket to
  /// end, without looking them up again.
  std::shared_ptr<const void> held;
};

class KernelMaps {
 public:
  virtual ~KernelMaps() = default;
  /// Everything the services and slots maps hold. The first call of the real adapter loads
  /// the programs and attaches them (or re-adopts what a previous run pinned).
  virtual core::Result<MapContents> readBack() = 0;
  /// Writes `ops` one element at a time, in order. BPF maps have no transactions: on error the
  /// ops before the refused one stay written, and the error names the refused one.
  virtual core::Result<void> apply(const std::vector<MapOp>& ops) = 0;
  /// Detaches the programs and removes every pin under the pin path; nothing there is fine.
  virtual core::Result<void> removeAll() = 0;
  /// Counts the elements of the affinity and reverse maps (the real adapter walks their keys:
  /// at most their sizes, 65,536 and 131,072 lookups, so the backend asks in full syncs only).
  virtual core::Result<DataPathCounts> countDataPathElements() = 0;
  /// Every connected UDP socket steered to an endpoint, in every network namespace of a
  /// process in the cgroup and in the settings' namespace directories (an iterator walks the
  /// namespace it is created in). A namespace
  /// that cannot be walked is named in `skipped` and the others are listed. EOPNOTSUPP: the
  /// kernel cannot end sockets (no bpf_sock_destroy, before Linux 6.5), and nothing is listed.
  virtual core::Result<SteeredSocketListing> listSteeredSockets() = 0;
  /// Ends each of `sockets` (from `listing`) that is still connected to its endpoint: it is
  /// disconnected with the pending error ECONNABORTED (the next receive gets it; a send fails
  /// with EDESTADDRREQ). Returns how many it ended; one already closed or reconnected is not an
  /// error, and a namespace that cannot be walked is added to `listing.skipped`.
  virtual core::Result<std::size_t> endSockets(SteeredSocketListing& listing,
                                               const std::vector<SteeredSocket>& sockets) = 0;
};

/// Where the real adapter works.
struct LibbpfSettings {
  /// The cgroup v2 directory whose sockets (and its descendants') are load-balanced.
  std::string cgroupPath;
  /// A directory on a bpffs mount for the maps and links ("/sys/fs/bpf/kproxy"); created when
  /// missing (its parent must be on bpffs).
  std::string pinPath;
  /// Directories of network namespace files (as /var/run/netns, where CNI setups bind-mount
  /// the pods' namespaces) whose sockets the stale-socket cleanup walks too, beside those of the
  /// cgroup's processes (which it can see only in the host's PID namespace).
  std::vector<std::string> namespaceDirs;
};

/// Whether this kernel can end sockets from an iterator (the kfunc bpf_sock_destroy, Linux
/// 6.5+), as its BTF says. Without it the plugin loads and attaches the rest.
bool kernelCanEndSockets();

/// The root of the node's cgroup v2 hierarchy, wherever it is mounted (/proc/self/mountinfo):
/// "/sys/fs/cgroup", or "/sys/fs/cgroup/unified" on a hybrid host. nullopt without one.
std::optional<std::string> cgroupV2Root();

/// What the mode needs from this kernel: the bpf() syscall and cgroup sock_addr programs,
/// kernel BTF, cgroup v2 at `settings.cgroupPath` and bpffs under `settings.pinPath`. The
/// error is one line naming what is missing.
core::Result<void> checkKernelSupport(const LibbpfSettings& settings);

/// The real kernel, after checkKernelSupport. Nothing is loaded or attached until the first
/// readBack or apply, so that --cleanup over this adapter attaches nothing.
core::Result<std::unique_ptr<KernelMaps>> openLibbpfKernel(const LibbpfSettings& settings);

/// An in-memory pair of maps with the kernel's answers that matter (deleting a missing
/// element: ENOENT), failure injection, and a watch on what the data path could see between
/// two writes.
class FakeKernelMaps : public KernelMaps {
 public:
  core::Result<MapContents> readBack() override;
  core::Result<void> apply(const std::vector<MapOp>& ops) override;
  core::Result<void> removeAll() override;
  core::Result<DataPathCounts> countDataPathElements() override { return dataPath; }
  core::Result<SteeredSocketListing> listSteeredSockets() override;
  core::Result<std::size_t> endSockets(SteeredSocketListing& listing,
                                       const std::vector<SteeredSocket>& sockets) override;

  /// Makes the op at this index of the next apply fail with `errnum` (then clears itself).
  void failNextApplyAt(std::size_t index, int errnum = E2BIG) {
    failAt_ = index;
    failErrno_ = errnum;
  }

  MapContents maps;
  std::size_t applies = 0;
  std::size_t writes = 0;  ///< elements written or deleted, over every apply
  std::size_t readBacks = 0;
  /// What countDataPathElements answers: the data path's own elements, which a test sets.
  DataPathCounts dataPath;
  /// With watchHalfWritten (it costs a walk of the maps per write): every state between two
  /// writes in which a service counted a slot that was not there ("… tcp 10.96.0.10:80 counts
  /// 7/1, which is missing"), as a connect would have met it.
  bool watchHalfWritten = false;
  std::vector<std::string> halfWritten;
  /// The steered sockets listSteeredSockets answers; endSockets removes those it ends.
  std::vector<SteeredSocket> sockets;
  /// The namespaces listSteeredSockets says it could not walk.
  std::vector<std::string> skippedNamespaces;
  /// What the socket calls fail with (0: they succeed); EOPNOTSUPP plays an older kernel.
  int socketErrno = 0;

 private:
  void checkWhole(const MapOp& after);
  std::optional<std::size_t> failAt_;
  int failErrno_ = E2BIG;
};

/// --dry-run: prints every write ("update slots 7/0 10.244.1.5:8080", "remove all pins"), then
/// hands it to `inner`, which answers every read.
class PrintingKernelMaps final : public KernelMaps {
 public:
  PrintingKernelMaps(std::unique_ptr<KernelMaps> inner, std::FILE* out) : inner_(std::move(inner)), out_(out) {}
  core::Result<MapContents> readBack() override { return inner_->readBack(); }
  core::Result<void> apply(const std::vector<MapOp>& ops) override;
  core::Result<void> removeAll() override;
  core::Result<DataPathCounts> countDataPathElements() override { return inner_->countDataPathElements(); }
  core::Result<SteeredSocketListing> listSteeredSockets() override { return inner_->listSteeredSockets(); }
  /// Prints "end socket cookie=… 10.200.0.1:40000 -> 10.96.0.10:53 (10.200.0.2:5353)" per socket.
  core::Result<std::size_t> endSockets(SteeredSocketListing& listing,
                                       const std::vector<SteeredSocket>& sockets) override;

 private:
  std::unique_ptr<KernelMaps> inner_;
  std::FILE* out_;
};

}  // namespace kproxy::ebpf
