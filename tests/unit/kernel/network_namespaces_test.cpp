// network_namespaces.h without privileges: a directory laid out as a cgroup (cgroup.procs files)
// stands for one, symbolic links to /proc/self/ns stand for /run/netns's bind mounts, and the
// process's own namespace is the one found; a file that is not a
// namespace is refused by setns before any permission check, so the failure of one namespace
// sparing the others is seen as root and as any other user.
#include "kproxy/kernel/network_namespaces.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <cerrno>
#include <filesystem>
#include <fstream>

#include "temp_directory.h"

using namespace kproxy::kernel;
namespace fs = std::filesystem;

namespace {

/// A fresh directory laid out as a cgroup, removed afterwards.
struct FakeCgroup : kproxy::testing::TempDirectory {
  FakeCgroup() : TempDirectory("kproxy-netns") {}
  void procs(const std::string& dir, const std::string& pids) const {
    fs::create_directories(path / dir);
    std::ofstream(path / dir / "cgroup.procs") << pids;
  }
};

std::uint64_t ownNamespaceInode() {
  struct stat st{};
  REQUIRE(::stat("/proc/self/ns/net", &st) == 0);
  return st.st_ino;
}

}  // namespace

TEST_CASE("network namespaces: each namespace of a cgroup's processes is found once, below it too",
          "[unit][kernel][netns]") {
  FakeCgroup cgroup;
  const std::string self = std::to_string(::getpid());
  // The process twice, in the cgroup and a child; a pid that no process has (it exited), and
  // 0, as cgroup.procs shows a process that this PID namespace does not.
  cgroup.procs("", self + "\n0\n");
  cgroup.procs("pod/container", self + "\n999999999\n");
  NetworkNamespaces found;
  found.addCgroup(cgroup.path.string());
  REQUIRE(found.list().size() == 1);
  CHECK(found.list()[0].inode == ownNamespaceInode());
  CHECK(found.list()[0].path == "/proc/" + self + "/ns/net");
  struct stat held{};
  REQUIRE(::fstat(found.list()[0].file.get(), &held) == 0);
  CHECK(held.st_ino == found.list()[0].inode);

  FakeCgroup empty;
  NetworkNamespaces none;
  none.addCgroup(empty.path.string());
  none.addCgroup((empty.path / "missing").string());
  CHECK(none.list().empty());
}

TEST_CASE("network namespaces: a directory's namespace files are found; other files and namespaces are not",
          "[unit][kernel][netns]") {
  FakeCgroup dir;  // a directory as /run/netns, where a symbolic link stands for a bind mount
  fs::create_symlink("/proc/self/ns/net", dir.path / "pod-a");
  fs::create_symlink("/proc/self/ns/uts", dir.path / "not-net");
  std::ofstream(dir.path / "left-over") << "";  // a mount point whose namespace is gone
  fs::create_directory(dir.path / "sub");
  NetworkNamespaces found;
  found.addDirectory(dir.path.string());
  found.addDirectory((dir.path / "missing").string());
  REQUIRE(found.list().size() == 1);
  CHECK(found.list()[0].inode == ownNamespaceInode());
  CHECK(found.list()[0].path == (dir.path / "pod-a").string());
  // The same namespace again, by another path, is held once.
  CHECK(found.add("/proc/self/ns/net"));
  CHECK(found.list().size() == 1);
  CHECK_FALSE(found.add("/dev/null"));
  CHECK(found.take().size() == 1);
}

TEST_CASE("network namespaces: one that cannot be joined costs only its own work", "[unit][kernel][netns]") {
  const FileDescriptor notNamespace(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  const FileDescriptor own(::open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC));
  REQUIRE(notNamespace);
  REQUIRE(own);
  std::vector<std::size_t> ran;
  const auto errors = inEachNetworkNamespace({notNamespace.get(), own.get(), notNamespace.get()}, [&](std::size_t i) {
    ran.push_back(i);
    return 42;  // what the work returns is passed on
  });
  REQUIRE(errors.size() == 3);
  CHECK(errors[0] == EINVAL);
  CHECK(errors[2] == EINVAL);
  if (::geteuid() == 0) {
    CHECK(errors[1] == 42);
    CHECK(ran == std::vector<std::size_t>{1});
  } else {
    // Joining even one's own namespace takes CAP_SYS_ADMIN.
    CHECK(errors[1] == EPERM);
    CHECK(ran.empty());
  }
  // Nothing is run for no namespace.
  CHECK(inEachNetworkNamespace({}, [&](std::size_t) { return 1; }).empty());
}

TEST_CASE("file descriptor: closed when its owner goes, moved without closing", "[unit][kernel][netns]") {
  int raw = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  REQUIRE(raw >= 0);
  {
    FileDescriptor a(raw);
    FileDescriptor b(std::move(a));
    CHECK_FALSE(a);
    CHECK(b.get() == raw);
    CHECK(::fcntl(raw, F_GETFD) >= 0);
  }
  CHECK(::fcntl(raw, F_GETFD) == -1);
  CHECK(errno == EBADF);
}
