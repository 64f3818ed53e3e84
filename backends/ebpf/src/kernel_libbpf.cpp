// The real kernel of ebpf mode (kernel.h): the programs from their libbpf skeleton, maps and
// cgroup links pinned under the pin path, elements read and written with the bpf() syscall.
#include <fcntl.h>
#include <linux/magic.h>
#include <linux/types.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <bpf/bpf.h>
#include <bpf/btf.h>
#include <bpf/libbpf.h>

#include <algorithm>
#include <cerrno>
#include <optional>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <tuple>

#include <fmt/format.h>

#include "kproxy/ebpf/kernel.h"
#include "kproxy/kernel/bpf_pins.h"
#include "kproxy/kernel/network_namespaces.h"
#include "kproxy_sock.skel.h"
#include "map_layout.h"

namespace kproxy::ebpf {
namespace {

core::Result<void> kernelError(std::string context, int errnum) {
  return core::makeError(core::ErrorCategory::kKernel, "ebpf: " + std::move(context), errnum);
}

bool onFilesystem(const std::string& path, long magic) {
  struct statfs fs{};
  return ::statfs(path.c_str(), &fs) == 0 && static_cast<long>(fs.f_type) == magic;
}

std::string parentOf(const std::string& path) {
  auto slash = path.find_last_of('/');
  return slash == std::string::npos || slash == 0 ? "/" : path.substr(0, slash);
}

kproxy_lb_service_key wireKey(const ServiceKey& k) {
  kproxy_lb_service_key w{};
  std::memcpy(w.address, k.address.address.data(), sizeof w.address);
  w.port = htobe16(k.address.port);
  w.protocol = k.protocol;
  w.family = static_cast<__u8>(k.address.family);
  return w;
}

ServiceKey fromWire(const kproxy_lb_service_key& w) {
  ServiceKey k;
  std::memcpy(k.address.address.data(), w.address, sizeof w.address);
  k.address.port = be16toh(w.port);
  k.address.family = w.family == KPROXY_FAMILY_IPV6 ? net::Family::kIPv6 : net::Family::kIPv4;
  k.protocol = w.protocol;
  return k;
}

kproxy_lb_service_value wireValue(const ServiceValue& v) {
  kproxy_lb_service_value w{};
  w.id = v.id;
  w.count = v.count;
  w.local_count = v.localCount;
  w.flags = v.flags;
  w.affinity_timeout = v.affinityTimeout;
  return w;
}

ServiceValue fromWire(const kproxy_lb_service_value& w) {
  return ServiceValue{w.id, w.count, w.local_count, w.flags, w.affinity_timeout};
}

kproxy_lb_endpoint wireEndpoint(const SocketAddress& a) {
  kproxy_lb_endpoint w{};
  std::memcpy(w.address, a.address.data(), sizeof w.address);
  w.port = htobe16(a.port);
  w.family = static_cast<__u8>(a.family);
  return w;
}

SocketAddress fromWire(const kproxy_lb_endpoint& w) {
  SocketAddress a;
  std::memcpy(a.address.data(), w.address, sizeof w.address);
  a.port = be16toh(w.port);
  a.family = w.family == KPROXY_FAMILY_IPV6 ? net::Family::kIPv6 : net::Family::kIPv4;
  return a;
}

/// How many elements a map holds (its keys walked; none looked up).
template <typename Key>
core::Result<std::size_t> countKeys(int fd, const char* name) {
  std::size_t n = 0;
  Key key{}, next{};
  const Key* previous = nullptr;
  for (;;) {
    if (bpf_map_get_next_key(fd, previous, &next) != 0) {
      if (errno == ENOENT) return n;
      return std::unexpected(kernelError(fmt::format("counting map {}", name), errno).error());
    }
    ++n;
    key = next;
    previous = &key;
  }
}

/// Every element of a map, as (key, value) of the wire types: in batches of the bpf() syscall
/// (BPF_MAP_LOOKUP_BATCH, kernel 5.6+), or one key after the other where the kernel has no
/// batches for the map.
template <typename Key, typename Value>
core::Result<std::vector<std::pair<Key, Value>>> dumpMap(int fd, const char* name) {
  std::vector<std::pair<Key, Value>> out;
  // Hash maps hand out whole buckets: a bucket larger than the room left is ENOSPC, and the
  // room grows.
  std::size_t room = 8192;
  std::vector<Key> keys(room);
  std::vector<Value> values(room);
  __u32 token = 0;
  bool first = true;
  LIBBPF_OPTS(bpf_map_batch_opts, opts);
  for (;;) {
    __u32 count = static_cast<__u32>(room);
    int rc = bpf_map_lookup_batch(fd, first ? nullptr : &token, &token, keys.data(), values.data(), &count, &opts);
    const int err = rc == 0 ? 0 : errno;
    if (rc != 0 && err != ENOENT) {
      if (err == ENOSPC && count == 0) {
        room *= 2;
        keys.resize(room);
        values.resize(room);
        continue;
      }
      if (first && count == 0 && (err == EINVAL || err == ENOTSUP || err == EOPNOTSUPP)) break;  // no batches here
      return std::unexpected(kernelError(fmt::format("reading map {}", name), err).error());
    }
    for (__u32 i = 0; i < count; ++i) out.emplace_back(keys[i], values[i]);
    if (err == ENOENT) return out;  // the last batch
    first = false;
  }
  Key key{}, next{};
  Value value{};
  const Key* previous = nullptr;
  for (;;) {
    if (bpf_map_get_next_key(fd, previous, &next) != 0) {
      if (errno == ENOENT) break;
      return std::unexpected(kernelError(fmt::format("reading map {}", name), errno).error());
    }
    // An element deleted between the two calls is gone: not an error.
    if (bpf_map_lookup_elem(fd, &next, &value) == 0) out.emplace_back(next, value);
    key = next;
    previous = &key;
  }
  return out;
}

/// The wire key and value of a slot op (the value is unused for a delete).
std::pair<kproxy_lb_slot_key, kproxy_lb_endpoint> wireOf(const MapOp& op, kproxy_lb_slot_key*) {
  return {kproxy_lb_slot_key{op.slot.serviceId, op.slot.slot}, wireEndpoint(op.endpoint)};
}
/// The wire key and value of a service op (the value is unused for a delete).
std::pair<kproxy_lb_service_key, kproxy_lb_service_value> wireOf(const MapOp& op, kproxy_lb_service_key*) {
  return {wireKey(op.service), wireValue(op.value)};
}

/// Writes `ops[begin, end)`, all of one kind on the map `fd` (Key: its key type), with one
/// bpf() call per chunk (BPF_MAP_UPDATE_BATCH / BPF_MAP_DELETE_BATCH, in order), or one call per
/// element where the kernel has no batches for the map. Each chunk is put in the wire form as it
/// goes. Returns the index of the op the kernel refused, with its errno, or nothing.
template <typename Key>
std::optional<std::pair<std::size_t, int>> writeRun(int fd, const std::vector<MapOp>& ops, std::size_t begin,
                                                    std::size_t end, bool& batches) {
  using Value = decltype(wireOf(ops[begin], static_cast<Key*>(nullptr)).second);
  constexpr std::size_t kChunk = 16384;
  const bool remove = ops[begin].kind == MapOpKind::kDeleteSlot || ops[begin].kind == MapOpKind::kDeleteService;
  std::vector<Key> keys;
  std::vector<Value> values;
  for (std::size_t at = begin; batches && at < end;) {
    const std::size_t n = std::min(kChunk, end - at);
    keys.resize(n);
    values.resize(n);
    for (std::size_t i = 0; i < n; ++i) std::tie(keys[i], values[i]) = wireOf(ops[at + i], static_cast<Key*>(nullptr));
    LIBBPF_OPTS(bpf_map_batch_opts, opts, .elem_flags = BPF_ANY);
    __u32 count = static_cast<__u32>(n);
    int rc = remove ? bpf_map_delete_batch(fd, keys.data(), &count, &opts)
                    : bpf_map_update_batch(fd, keys.data(), values.data(), &count, &opts);
    if (rc != 0) {
      const int err = errno;
      if (at == begin && count == 0 && (err == EINVAL || err == ENOTSUP || err == EOPNOTSUPP)) {
        batches = false;  // no batches here: element by element below
        break;
      }
      return std::pair{at + count, err};
    }
    at += n;
  }
  if (batches) return std::nullopt;
  for (std::size_t i = begin; i < end; ++i) {
    const auto [key, value] = wireOf(ops[i], static_cast<Key*>(nullptr));
    int rc = remove ? bpf_map_delete_elem(fd, &key) : bpf_map_update_elem(fd, &key, &value, BPF_ANY);
    if (rc != 0) return std::pair{i, errno};
  }
  return std::nullopt;
}

/// The namespaces a listing walked, held open until the listing goes (SteeredSocketListing::held).
using HeldNamespaces = std::vector<kernel::NetworkNamespace>;

/// What the iterator `link` writes in each of `which` (indexes into `namespaces`), by index: a
/// reader walks the namespace it was created in, so the readers are created in each namespace
/// in turn (kernel::inEachNetworkNamespace) and read here. A namespace whose reader cannot be
/// created or read is left out, with a line in `skipped`.
std::vector<std::pair<std::size_t, std::string>> runIterator(bpf_link* link, const HeldNamespaces& namespaces,
                                                             const std::vector<std::size_t>& which,
                                                             std::vector<std::string>& skipped) {
  std::vector<int> fds;
  for (std::size_t i : which) fds.push_back(namespaces[i].file.get());
  std::vector<kernel::FileDescriptor> readers(which.size());
  std::vector<char> joined(which.size(), 0);
  const std::vector<int> errors = kernel::inEachNetworkNamespace(fds, [&](std::size_t i) {
    joined[i] = 1;
    readers[i].reset(bpf_iter_create(bpf_link__fd(link)));
    return readers[i] ? 0 : errno;
  });
  auto skip = [&](std::size_t i, const char* what, int err) {
    skipped.push_back(fmt::format("{}: {}: {}", namespaces[which[i]].path, what, std::strerror(err)));
  };
  std::vector<std::pair<std::size_t, std::string>> out;
  char buf[16384];
  for (std::size_t i = 0; i < which.size(); ++i) {
    if (errors[i] != 0) {
      skip(i, joined[i] ? "creating a socket iterator in it" : "joining it", errors[i]);
      continue;
    }
    std::string written;
    int err = 0;
    for (;;) {
      const ssize_t n = ::read(readers[i].get(), buf, sizeof buf);
      if (n == 0) break;
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        err = errno;
        break;
      }
      written.append(buf, static_cast<std::size_t>(n));
    }
    if (err != 0)
      skip(i, "reading its socket iterator", err);
    else
      out.emplace_back(which[i], std::move(written));
  }
  return out;
}

class LibbpfKernel final : public KernelMaps {
 public:
  explicit LibbpfKernel(LibbpfSettings settings) : settings_(std::move(settings)) {}
  ~LibbpfKernel() override { unload(); }
  LibbpfKernel(const LibbpfKernel&) = delete;
  LibbpfKernel& operator=(const LibbpfKernel&) = delete;

  core::Result<MapContents> readBack() override {
    if (auto loaded = ensureLoaded(); !loaded) return std::unexpected(loaded.error());
    MapContents out;
    auto services = dumpMap<kproxy_lb_service_key, kproxy_lb_service_value>(servicesFd(), "kproxy_services");
    if (!services) return std::unexpected(services.error());
    for (const auto& [k, v] : *services) out.services.emplace(fromWire(k), fromWire(v));
    auto slots = dumpMap<kproxy_lb_slot_key, kproxy_lb_endpoint>(slotsFd(), "kproxy_slots");
    if (!slots) return std::unexpected(slots.error());
    for (const auto& [k, v] : *slots) out.slots.emplace(SlotKey{k.service_id, k.slot}, fromWire(v));
    return out;
  }

  core::Result<void> apply(const std::vector<MapOp>& ops) override {
    if (auto loaded = ensureLoaded(); !loaded) return loaded;
    // Runs of one kind go in batches, the runs in the differ's order: slots before the counts
    // that expose them, as element by element.
    for (std::size_t begin = 0; begin < ops.size();) {
      std::size_t end = begin + 1;
      while (end < ops.size() && ops[end].kind == ops[begin].kind) ++end;
      const bool slot = ops[begin].kind == MapOpKind::kUpdateSlot || ops[begin].kind == MapOpKind::kDeleteSlot;
      auto refused = slot ? writeRun<kproxy_lb_slot_key>(slotsFd(), ops, begin, end, batches_)
                          : writeRun<kproxy_lb_service_key>(servicesFd(), ops, begin, end, batches_);
      if (refused) return kernelError("kernel refused \"" + ops[refused->first].toText() + "\"", refused->second);
      begin = end;
    }
    return {};
  }

  core::Result<DataPathCounts> countDataPathElements() override {
    if (auto loaded = ensureLoaded(); !loaded) return std::unexpected(loaded.error());
    auto affinity = countKeys<kproxy_lb_affinity_key>(bpf_map__fd(skel_->maps.kproxy_affinity), "kproxy_affinity");
    if (!affinity) return std::unexpected(affinity.error());
    auto reverse = countKeys<kproxy_lb_reverse_key>(bpf_map__fd(skel_->maps.kproxy_reverse), "kproxy_reverse");
    if (!reverse) return std::unexpected(reverse.error());
    return DataPathCounts{*affinity, *reverse};
  }

  core::Result<SteeredSocketListing> listSteeredSockets() override {
    if (auto loaded = ensureLoaded(); !loaded) return std::unexpected(loaded.error());
    if (listLink_ == nullptr) return std::unexpected(kernelError(noEndSockets_.first, noEndSockets_.second).error());
    kernel::NetworkNamespaces found;
    found.addCgroup(settings_.cgroupPath);
    for (const auto& dir : settings_.namespaceDirs) found.addDirectory(dir);
    auto namespaces = std::make_shared<HeldNamespaces>(found.take());
    std::vector<std::size_t> all(namespaces->size());
    for (std::size_t i = 0; i < all.size(); ++i) all[i] = i;
    SteeredSocketListing out;
    for (const auto& [index, written] : runIterator(listLink_, *namespaces, all, out.skipped)) {
      kproxy_lb_socket_record record{};
      for (std::size_t at = 0; at + sizeof record <= written.size(); at += sizeof record) {
        std::memcpy(&record, written.data() + at, sizeof record);
        out.sockets.push_back(SteeredSocket{record.socket_cookie, fromWire(record.local), fromWire(record.service),
                                            fromWire(record.endpoint), (*namespaces)[index].inode});
      }
    }
    out.held = std::move(namespaces);
    return out;
  }

  core::Result<std::size_t> endSockets(SteeredSocketListing& listing,
                                       const std::vector<SteeredSocket>& sockets) override {
    if (auto loaded = ensureLoaded(); !loaded) return std::unexpected(loaded.error());
    if (endLink_ == nullptr) return std::unexpected(kernelError(noEndSockets_.first, noEndSockets_.second).error());
    if (listing.held == nullptr)
      return std::unexpected(kernelError("ending sockets without their listing", EINVAL).error());
    const auto& namespaces = *std::static_pointer_cast<const HeldNamespaces>(listing.held);
    const int destroyFd = bpf_map__fd(skel_->maps.kproxy_destroy);
    std::size_t ended = 0;
    for (std::size_t begin = 0; begin < sockets.size(); begin += KPROXY_DESTROY_BATCH) {
      const std::size_t end = std::min(sockets.size(), begin + KPROXY_DESTROY_BATCH);
      auto pass = endBatch(destroyFd, namespaces, sockets, begin, end, listing.skipped);
      if (!pass) return pass;
      ended += *pass;
    }
    return ended;
  }

  core::Result<void> removeAll() override {
    // The links are detached before any pin goes (kernel/bpf_pins.h).
    auto removed = kernel::removeBpfPins(settings_.pinPath);
    if (!removed) return kernelError(removed.error().message(), removed.error().errnum);
    unload();
    return {};
  }

 private:
  void unload() {
    bpf_link__destroy(listLink_);
    bpf_link__destroy(endLink_);
    listLink_ = endLink_ = nullptr;
    kproxy_sock__destroy(skel_);
    skel_ = nullptr;
  }

  /// One ending pass over `sockets[begin, end)`: named in the destroy map, the iterator run in
  /// the namespaces that hold them, the map emptied again whatever happened.
  core::Result<std::size_t> endBatch(int destroyFd, const HeldNamespaces& namespaces,
                                     const std::vector<SteeredSocket>& sockets, std::size_t begin, std::size_t end,
                                     std::vector<std::string>& skipped) {
    auto forget = [&](std::size_t upTo) {
      for (std::size_t i = begin; i < upTo; ++i) bpf_map_delete_elem(destroyFd, &sockets[i].cookie);
    };
    std::set<std::uint64_t> holding;
    for (std::size_t i = begin; i < end; ++i) {
      holding.insert(sockets[i].netns);
      const kproxy_lb_endpoint endpoint = wireEndpoint(sockets[i].endpoint);
      if (bpf_map_update_elem(destroyFd, &sockets[i].cookie, &endpoint, BPF_ANY) != 0) {
        const int err = errno;
        forget(i);
        return std::unexpected(kernelError("naming a socket to end in kproxy_destroy", err).error());
      }
    }
    std::vector<std::size_t> which;
    for (std::size_t i = 0; i < namespaces.size(); ++i)
      if (holding.contains(namespaces[i].inode)) which.push_back(i);
    std::size_t ended = 0;
    for (const auto& [index, written] : runIterator(endLink_, namespaces, which, skipped))
      ended += written.size() / sizeof(std::uint64_t);
    forget(end);
    return ended;
  }

  /// Whether the kernel takes batched writes (learned from the first refusal of one).
  bool batches_ = true;
  int servicesFd() const { return bpf_map__fd(skel_->maps.kproxy_services); }
  int slotsFd() const { return bpf_map__fd(skel_->maps.kproxy_slots); }
  std::string linkPath(const std::string& program) const { return settings_.pinPath + "/link_" + program; }

  /// Loads the programs over the pinned maps (pinning them the first time) and attaches each
  /// to the cgroup: a link a previous run pinned on the same cgroup gets the new program in
  /// place (no moment without one), any other is attached and pinned.
  core::Result<void> ensureLoaded() {
    if (skel_ != nullptr) return {};
    if (::mkdir(settings_.pinPath.c_str(), 0700) != 0 && errno != EEXIST)
      return kernelError("creating the pin directory " + settings_.pinPath, errno);
    if (!onFilesystem(settings_.pinPath, BPF_FS_MAGIC))
      return kernelError("the pin path " + settings_.pinPath + " is not on a bpf filesystem", EINVAL);
    kproxy_sock* skel = kproxy_sock__open();
    if (skel == nullptr) return kernelError("opening the BPF object", errno);
    // The stale-socket passes need bpf_sock_destroy: without it they are not loaded, the rest is.
    const bool canEnd = kernelCanEndSockets();
    bpf_program__set_autoload(skel->progs.kproxy_list_steered_udp, canEnd);
    bpf_program__set_autoload(skel->progs.kproxy_end_stale_udp, canEnd);
    bpf_map* map = nullptr;
    bpf_object__for_each_map(map, skel->obj) {
      const std::string path = settings_.pinPath + "/" + bpf_map__name(map);
      if (int rc = bpf_map__set_pin_path(map, path.c_str()); rc != 0) {
        kproxy_sock__destroy(skel);
        return kernelError("pin path " + path, -rc);
      }
    }
    if (int rc = kproxy_sock__load(skel); rc != 0) {
      kproxy_sock__destroy(skel);
      return kernelError("loading the BPF programs (a map pinned under " + settings_.pinPath +
                             " by another version? --cleanup removes them)",
                         -rc);
    }
    const kernel::FileDescriptor cgroup(::open(settings_.cgroupPath.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!cgroup) {
      kproxy_sock__destroy(skel);
      return kernelError("opening the cgroup " + settings_.cgroupPath, errno);
    }
    struct stat cgroupStat{};
    ::fstat(cgroup.get(), &cgroupStat);
    auto attached = attachAll(skel, cgroup.get(), cgroupStat.st_ino);
    if (!attached) {
      kproxy_sock__destroy(skel);
      return attached;
    }
    skel_ = skel;
    noEndSockets_ = {"this kernel cannot end sockets (bpf_sock_destroy, Linux 6.5+)", EOPNOTSUPP};
    if (canEnd) {
      // Iterator links live with this process (nothing to pin: a pass is run, not attached).
      // Refused, they cost the stale-socket passes only.
      listLink_ = bpf_program__attach_iter(skel->progs.kproxy_list_steered_udp, nullptr);
      endLink_ = listLink_ == nullptr ? nullptr : bpf_program__attach_iter(skel->progs.kproxy_end_stale_udp, nullptr);
      if (endLink_ == nullptr) {
        noEndSockets_ = {"attaching the socket iterators", errno};
        bpf_link__destroy(listLink_);
        listLink_ = nullptr;
      }
    }
    return {};
  }

  core::Result<void> attachAll(kproxy_sock* skel, int cgroup, std::uint64_t cgroupId) {
    bpf_program* program = nullptr;
    bpf_object__for_each_program(program, skel->obj) {
      // The iterators are run by the plugin, not attached to the cgroup.
      if (bpf_program__expected_attach_type(program) == BPF_TRACE_ITER) continue;
      const std::string path = linkPath(bpf_program__name(program));
      bpf_link* pinned = ::access(path.c_str(), F_OK) == 0 ? bpf_link__open(path.c_str()) : nullptr;
      if (pinned != nullptr) {
        bpf_link_info info{};
        __u32 length = sizeof info;
        const bool sameCgroup = bpf_obj_get_info_by_fd(bpf_link__fd(pinned), &info, &length) == 0 &&
                                info.type == BPF_LINK_TYPE_CGROUP && info.cgroup.cgroup_id == cgroupId;
        if (sameCgroup) {
          const int rc = bpf_link__update_program(pinned, program);
          bpf_link__destroy(pinned);
          if (rc != 0) return kernelError("replacing the program of " + path, -rc);
          continue;
        }
        // Pinned on another cgroup (the setting changed): detached, then attached anew.
        bpf_link__detach(pinned);
        bpf_link__destroy(pinned);
        ::unlink(path.c_str());
      }
      bpf_link* link = bpf_program__attach_cgroup(program, cgroup);
      if (link == nullptr)
        return kernelError(fmt::format("attaching {} to {}", bpf_program__name(program), settings_.cgroupPath), errno);
      const int rc = bpf_link__pin(link, path.c_str());
      bpf_link__destroy(link);  // the pin holds it
      if (rc != 0) return kernelError("pinning " + path, -rc);
    }
    return {};
  }

  LibbpfSettings settings_;
  kproxy_sock* skel_ = nullptr;
  bpf_link* listLink_ = nullptr;  ///< the stale-socket passes' iterators; null without bpf_sock_destroy
  bpf_link* endLink_ = nullptr;
  std::pair<std::string, int> noEndSockets_;  ///< why there are no iterators: context, errno
};

}  // namespace

std::optional<std::string> cgroupV2Root() {
  std::ifstream mountinfo("/proc/self/mountinfo");
  std::string line;
  while (std::getline(mountinfo, line)) {
    // "36 25 0:31 / /sys/fs/cgroup rw,… shared:9 - cgroup2 cgroup2 rw,…"
    auto dash = line.find(" - ");
    if (dash == std::string::npos) continue;
    std::istringstream after(line.substr(dash + 3));
    std::string fstype;
    after >> fstype;
    if (fstype != "cgroup2") continue;
    std::istringstream before(line.substr(0, dash));
    std::string id, parent, device, root, mountPoint;
    before >> id >> parent >> device >> root >> mountPoint;
    if (root == "/") return mountPoint;
  }
  return std::nullopt;
}

bool kernelCanEndSockets() {
  btf* vmlinux = btf__load_vmlinux_btf();
  if (vmlinux == nullptr) return false;
  const bool found = btf__find_by_name_kind(vmlinux, "bpf_sock_destroy", BTF_KIND_FUNC) > 0;
  btf__free(vmlinux);
  return found;
}

core::Result<void> checkKernelSupport(const LibbpfSettings& settings) {
  const int probe = libbpf_probe_bpf_prog_type(BPF_PROG_TYPE_CGROUP_SOCK_ADDR, nullptr);
  if (probe < 0) return kernelError("this kernel cannot load cgroup sock_addr BPF programs (bpf syscall)", -probe);
  if (probe == 0) return kernelError("this kernel has no cgroup sock_addr BPF programs (CONFIG_CGROUP_BPF)", EOPNOTSUPP);
  if (::access("/sys/kernel/btf/vmlinux", R_OK) != 0)
    return kernelError("this kernel has no BTF (/sys/kernel/btf/vmlinux; CONFIG_DEBUG_INFO_BTF)", errno);
  if (settings.cgroupPath.empty()) return kernelError("no cgroup v2 hierarchy is mounted", ENOENT);
  if (!onFilesystem(settings.cgroupPath, CGROUP2_SUPER_MAGIC))
    return kernelError("--ebpf-cgroup-path " + settings.cgroupPath + " is not a cgroup v2 directory", ENOTDIR);
  const std::string bpffs = ::access(settings.pinPath.c_str(), F_OK) == 0 ? settings.pinPath : parentOf(settings.pinPath);
  if (!onFilesystem(bpffs, BPF_FS_MAGIC))
    return kernelError("the pin path " + settings.pinPath + " is not on a bpf filesystem (mount -t bpf bpf " + bpffs + ")",
                       ENOTDIR);
  return {};
}

core::Result<std::unique_ptr<KernelMaps>> openLibbpfKernel(const LibbpfSettings& settings) {
  if (auto supported = checkKernelSupport(settings); !supported) return std::unexpected(supported.error());
  return std::unique_ptr<KernelMaps>(std::make_unique<LibbpfKernel>(settings));
}

}  // namespace kproxy::ebpf
