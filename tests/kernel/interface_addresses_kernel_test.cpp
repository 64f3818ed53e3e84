// The node's interface addresses over rtnetlink, in a fresh network namespace: the one-off
// read, and the watcher seeing addresses added and removed after it started.

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kproxy/backends/common/chain_names.h"
#include "kproxy/kernel/interface_addresses.h"
#include "netns.h"

using namespace kproxy;
using kproxy::testing::FreshNetns;
using kproxy::testing::sh;

namespace {

bool has(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

// What the watcher reported, for the test thread to wait on.
struct Reports {
  std::mutex mutex;
  std::condition_variable cv;
  std::vector<std::vector<std::string>> lists;

  void add(std::vector<std::string> addresses) {
    std::lock_guard lock(mutex);
    lists.push_back(std::move(addresses));
    cv.notify_all();
  }
  // Waits (at most 5 s) for a report satisfying `ok`; returns the last report seen.
  template <typename Pred>
  std::vector<std::string> waitFor(Pred ok) {
    std::unique_lock lock(mutex);
    cv.wait_for(lock, std::chrono::seconds(5), [&] { return !lists.empty() && ok(lists.back()); });
    return lists.empty() ? std::vector<std::string>{} : lists.back();
  }
};

}  // namespace

TEST_CASE("interface addresses are read over rtnetlink", "[kernel]") {
  FreshNetns netns;
  sh("ip link set lo up");
  sh("ip link add kp-addr0 type veth peer name kp-addr1 && ip link set kp-addr0 up && ip link set kp-addr1 up");
  sh("ip addr add 10.77.0.1/24 dev kp-addr0");
  sh("ip addr add fd00:77::1/64 dev kp-addr0 nodad");
  sh("ip addr add 10.88.0.1 peer 10.88.0.2 dev kp-addr0");

  auto addresses = kernel::readInterfaceAddresses(backends::kIpvsDummyInterface);
  REQUIRE(addresses);
  INFO(addresses->size());
  CHECK(has(*addresses, "127.0.0.1"));
  CHECK(has(*addresses, "10.77.0.1"));
  CHECK(has(*addresses, "fd00:77::1"));
  CHECK(has(*addresses, "10.88.0.1"));       // the own end of a point-to-point address
  CHECK_FALSE(has(*addresses, "10.88.0.2"));  // not its peer
  CHECK(std::is_sorted(addresses->begin(), addresses->end()));
}

TEST_CASE("the interface address watcher follows added and removed addresses", "[kernel]") {
  FreshNetns netns;
  sh("ip link set lo up");
  sh("ip link add kp-addr0 type veth peer name kp-addr1 && ip link set kp-addr0 up && ip link set kp-addr1 up");
  sh("ip addr add 10.77.0.1/24 dev kp-addr0");

  Reports reports;
  auto watcher = kernel::InterfaceAddressWatcher::start(
      backends::kIpvsDummyInterface, [&](std::vector<std::string> a) { reports.add(std::move(a)); },
      std::chrono::milliseconds(50));
  REQUIRE(watcher);
  {
    std::lock_guard lock(reports.mutex);
    REQUIRE(reports.lists.size() == 1);  // the first read, before start returned
    CHECK(has(reports.lists.front(), "10.77.0.1"));
    CHECK_FALSE(has(reports.lists.front(), "10.78.0.2"));
  }

  // Another subnet: deleting 10.77.0.1/24 below would also delete its secondaries.
  sh("ip addr add 10.78.0.2/24 dev kp-addr0");
  sh("ip addr add fd00:77::2/64 dev kp-addr0 nodad");
  auto seen = reports.waitFor([](const auto& a) { return has(a, "10.78.0.2") && has(a, "fd00:77::2"); });
  CHECK(has(seen, "10.78.0.2"));
  CHECK(has(seen, "fd00:77::2"));
  CHECK(has(seen, "10.77.0.1"));

  sh("ip addr del 10.77.0.1/24 dev kp-addr0");
  seen = reports.waitFor([](const auto& a) { return !has(a, "10.77.0.1"); });
  CHECK_FALSE(has(seen, "10.77.0.1"));
  CHECK(has(seen, "10.78.0.2"));

  watcher->reset();  // stops its thread before the namespace goes
}

// IPVS mode binds every ClusterIP to kube-ipvs0: those are no node addresses (upstream leaves
// them out too), and binding one must not make the proxy resync. The host kernel has no dummy
// links; the exclusion goes by name, so a veth named kube-ipvs0 stands in.
TEST_CASE("kube-ipvs0's addresses are neither read nor reported", "[kernel]") {
  FreshNetns netns;
  sh("ip link set lo up");
  sh("ip link add kp-addr0 type veth peer name kp-addr1 && ip link set kp-addr0 up && ip link set kp-addr1 up");
  sh("ip addr add 10.77.0.1/24 dev kp-addr0");
  sh("ip link add kube-ipvs0 type veth peer name kp-addr2");
  sh("ip addr add 10.96.0.10/32 dev kube-ipvs0");

  auto addresses = kernel::readInterfaceAddresses(backends::kIpvsDummyInterface);
  REQUIRE(addresses);
  CHECK(has(*addresses, "10.77.0.1"));
  CHECK_FALSE(has(*addresses, "10.96.0.10"));

  Reports reports;
  auto watcher = kernel::InterfaceAddressWatcher::start(
      backends::kIpvsDummyInterface, [&](std::vector<std::string> a) { reports.add(std::move(a)); },
      std::chrono::milliseconds(50));
  REQUIRE(watcher);
  {
    std::lock_guard lock(reports.mutex);
    REQUIRE(reports.lists.size() == 1);
    CHECK_FALSE(has(reports.lists.front(), "10.96.0.10"));
  }
  // Many Services' addresses at once, then a real change after them: the next report is that
  // change's, with none of kube-ipvs0's addresses.
  sh("for i in $(seq 11 60); do ip addr add 10.96.0.$i/32 dev kube-ipvs0; done");
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // ten quiet periods
  sh("ip addr add 10.78.0.2/24 dev kp-addr0");
  auto seen = reports.waitFor([](const auto& a) { return has(a, "10.78.0.2"); });
  CHECK(has(seen, "10.78.0.2"));
  CHECK_FALSE(has(seen, "10.96.0.11"));
  {
    std::lock_guard lock(reports.mutex);
    CHECK(reports.lists.size() == 2);  // the first read and 10.78.0.2: nothing for kube-ipvs0
  }
  watcher->reset();
}

TEST_CASE("interface addresses are read while they change, and the watcher starts anyway", "[kernel]") {
  FreshNetns netns;
  sh("ip link set lo up");
  sh("ip link add kp-addr0 type veth peer name kp-addr1 && ip link set kp-addr0 up && ip link set kp-addr1 up");
  // Enough addresses that a dump takes several messages, and so can be interrupted.
  std::string batch;
  for (int i = 0; i < 1500; ++i)
    batch += "addr add 10.66." + std::to_string(i / 250) + "." + std::to_string(i % 250 + 1) + "/32 dev kp-addr0\n";
  {
    FILE* p = ::popen("ip -batch -", "w");
    REQUIRE(p != nullptr);
    std::fputs(batch.c_str(), p);
    REQUIRE(::pclose(p) == 0);
  }
  // Someone changes addresses all along (a pod's veth coming up, DHCP): each change during a
  // dump interrupts it (NLM_F_DUMP_INTR).
  std::atomic<bool> stop{false};
  std::thread churn([&] {
    for (int i = 0; !stop; ++i)
      (void)kproxy::testing::run("ip addr " + std::string(i % 2 == 0 ? "add" : "del") +
                                 " 10.99.0.1/32 dev kp-addr1");
  });
  int failures = 0;
  for (int i = 0; i < 300; ++i) {
    auto addresses = kernel::readInterfaceAddresses(backends::kIpvsDummyInterface);
    if (!addresses) {
      ++failures;
      UNSCOPED_INFO(addresses.error().message());
      continue;
    }
    // 1500 + loopback's two + the link-local ones, with or without the churned address.
    CHECK(addresses->size() >= 1502);
  }
  Reports reports;
  auto watcher = kernel::InterfaceAddressWatcher::start(
      backends::kIpvsDummyInterface, [&](std::vector<std::string> a) { reports.add(std::move(a)); },
      std::chrono::milliseconds(50));
  stop = true;
  churn.join();
  CHECK(failures == 0);
  REQUIRE(watcher);
  sh("ip addr add 10.98.0.1/32 dev kp-addr1");
  CHECK(has(reports.waitFor([](const auto& a) { return has(a, "10.98.0.1"); }), "10.98.0.1"));
}
