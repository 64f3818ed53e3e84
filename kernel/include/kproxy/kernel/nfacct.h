#pragma once
/// Extended accounting objects (nfacct, NFNL_SUBSYS_ACCT over netfilter netlink): named packet
/// and byte counters that iptables rules count into with `-m nfacct --nfacct-name NAME`, as
/// upstream's pkg/proxy/util/nfacct does. Objects live in a network namespace: the socket is
/// the opening thread's namespace's.
/// Thread-safety: an Nfacct is used by one thread at a time; open one per thread that needs it.

#include <linux/netlink.h>

#include <cstddef>
#include <cstdio>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "kproxy/core/error.h"

namespace kproxy::kernel {

/// The longest object name the kernel keeps (NFACCT_NAME_MAX less the terminating NUL).
inline constexpr std::size_t kNfacctNameMax = 31;

struct NfacctCounter {
  std::string name;
  std::uint64_t packets = 0;
  std::uint64_t bytes = 0;
  bool operator==(const NfacctCounter&) const = default;
};

enum class NfacctRequest : std::uint8_t {
  kCreate,  ///< NFNL_MSG_ACCT_NEW with NLM_F_CREATE | NLM_F_ACK (fails with EBUSY when it exists)
  kGet,     ///< NFNL_MSG_ACCT_GET of one name with NLM_F_ACK (fails with ENOENT when absent)
};

/// Room for any request encodeNfacctRequest writes.
inline constexpr std::size_t kNfacctRequestRoom = 128;

/// Encodes a request for `name` (at most kNfacctNameMax bytes, checked by the caller) into
/// `buf`, which must have kNfacctRequestRoom bytes and be aligned for nlmsghdr. Returns the
/// message (its nlmsg_len says how long it is).
const nlmsghdr* encodeNfacctRequest(std::span<char> buf, NfacctRequest request, std::string_view name,
                                    std::uint32_t seq);

/// Decodes an object as the kernel describes it (an NFNL_MSG_ACCT_NEW message: the name and
/// both counters). kDecode when one of the three is missing or malformed.
core::Result<NfacctCounter> decodeNfacctCounter(const nlmsghdr* message);

class Nfacct {
 public:
  virtual ~Nfacct() = default;
  /// The object named `name`. An error with errnum ENOENT when there is none; EINVAL for a
  /// name that is empty or too long.
  virtual core::Result<NfacctCounter> get(const std::string& name) = 0;
  /// Creates the object unless it exists (upstream's Ensure); counters of an existing one are
  /// kept.
  virtual core::Result<void> ensure(const std::string& name) = 0;
};

/// Opens a netfilter netlink socket in the calling thread's namespace and checks that the
/// kernel has nfacct, as upstream does: a GET of a name that may not exist is answered, or
/// refused with ENOENT. Any other answer (the subsystem is not there) is an error
/// (kNotFound, with the kernel's errno).
core::Result<std::unique_ptr<Nfacct>> makeNetlinkNfacct();

/// --dry-run's: each object `inner` lacks is printed as the nfacct(8) command that would create
/// it ("nfacct add NAME"), then created in `inner` (objects in memory).
class PrintingNfacct final : public Nfacct {
 public:
  PrintingNfacct(std::unique_ptr<Nfacct> inner, std::FILE* out) : inner_(std::move(inner)), out_(out) {}
  core::Result<NfacctCounter> get(const std::string& name) override { return inner_->get(name); }
  core::Result<void> ensure(const std::string& name) override;

 private:
  std::unique_ptr<Nfacct> inner_;
  std::FILE* out_;
};

/// Objects in memory, for tests and --dry-run.
class FakeNfacct final : public Nfacct {
 public:
  core::Result<NfacctCounter> get(const std::string& name) override;
  core::Result<void> ensure(const std::string& name) override;

  std::map<std::string, NfacctCounter> objects;
  bool failEnsure = false;  ///< ensure() fails with EPERM
  int ensureCalls = 0;
};

}  // namespace kproxy::kernel
