// MessageBuffer: a netlink batch's bytes as they are encoded. What is written survives
// every growth, a cut-back drops only what follows, and a moved buffer owns the bytes.
#include "kproxy/kernel/message_buffer.h"

#include <linux/netlink.h>

#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <string>
#include <utility>

using kproxy::kernel::MessageBuffer;

namespace {

/// A netlink header of `len` bytes whose payload repeats `fill`.
nlmsghdr* writeMessage(char* at, std::uint32_t len, char fill) {
  auto* nlh = reinterpret_cast<nlmsghdr*>(at);
  std::memset(at, fill, len);
  nlh->nlmsg_len = len;
  nlh->nlmsg_type = static_cast<std::uint16_t>(fill);
  return nlh;
}

}  // namespace

TEST_CASE("a MessageBuffer keeps every message across growth, far past its first room", "[unit]") {
  MessageBuffer buf;
  CHECK(buf.empty());
  // 3,000 messages of 1,001 bytes (aligned to 1,004): about 3 MiB, many times the first map.
  for (int i = 0; i < 3000; ++i) buf.commit(writeMessage(buf.tail(), 1001, static_cast<char>('a' + i % 26)));
  REQUIRE(buf.size() == 3000u * NLMSG_ALIGN(1001));
  const auto data = buf.data();
  int left = static_cast<int>(data.size()), count = 0;
  for (auto* nlh = reinterpret_cast<const nlmsghdr*>(data.data()); NLMSG_OK(nlh, left); nlh = NLMSG_NEXT(nlh, left)) {
    const char want = static_cast<char>('a' + count % 26);
    CHECK(nlh->nlmsg_type == static_cast<std::uint16_t>(want));
    CHECK(reinterpret_cast<const char*>(nlh)[nlh->nlmsg_len - 1] == want);
    ++count;
  }
  CHECK(count == 3000);
}

TEST_CASE("a MessageBuffer appends bytes as they are, cuts back, clears and moves", "[unit]") {
  MessageBuffer buf;
  buf.reserve(10);
  const std::string first(5000, 'x'), second(70000, 'y');
  buf.append(first);
  buf.append(second);
  REQUIRE(buf.size() == first.size() + second.size());
  CHECK(std::string(buf.data().data(), first.size()) == first);
  CHECK(std::string(buf.data().data() + first.size(), second.size()) == second);

  buf.truncate(first.size());
  CHECK(buf.size() == first.size());
  buf.truncate(first.size() + 1);  // never grows
  CHECK(buf.size() == first.size());
  buf.append(std::string(3, 'z'));
  CHECK(std::string(buf.data().data(), buf.size()) == first + "zzz");

  MessageBuffer moved(std::move(buf));
  CHECK(buf.empty());
  CHECK(std::string(moved.data().data(), moved.size()) == first + "zzz");
  MessageBuffer assigned;
  assigned.append(std::string(1, 'q'));
  assigned = std::move(moved);
  CHECK(std::string(assigned.data().data(), assigned.size()) == first + "zzz");

  assigned.clear();
  CHECK(assigned.empty());
  assigned.append(std::string(2, 'w'));
  CHECK(std::string(assigned.data().data(), assigned.size()) == "ww");
}
