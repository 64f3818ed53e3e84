#pragma once
/// IptablesRuleSpec: one iptables rule, built in any order and printed in the order
/// `iptables-save` prints it (addresses, interface, protocol, then the matches in the order
/// they were added, then the target), so a rendered rule compares as text with what the kernel
/// gives back. Shared by the iptables backend and the IPVS backend's iptables rules.
/// Header-only (needs fmt). Thread-safety: a value type.

#include <string>
#include <string_view>

#include <fmt/format.h>

namespace kproxy::backends {

class IptablesRuleSpec {
 public:
  IptablesRuleSpec& src(std::string_view prefix, bool negate = false) {
    src_ = fmt::format("{}-s {}", negate ? "! " : "", prefix);
    return *this;
  }
  IptablesRuleSpec& dst(std::string_view prefix, bool negate = false) {
    dst_ = fmt::format("{}-d {}", negate ? "! " : "", prefix);
    return *this;
  }
  IptablesRuleSpec& in(std::string_view iface, bool negate = false) {
    in_ = fmt::format("{}-i {}", negate ? "! " : "", iface);
    return *this;
  }
  IptablesRuleSpec& proto(std::string_view p) {
    proto_ = p;
    return *this;
  }
  /// `-m comment --comment "TEXT"`; nothing for an empty text. A backslash, double quote or
  /// single quote gets a backslash, as iptables-save (1.8) prints it and iptables-restore reads it.
  IptablesRuleSpec& comment(std::string_view text) {
    if (text.empty()) return *this;
    std::string escaped;
    for (char c : text) {
      if (c == '\\' || c == '"' || c == '\'') escaped += '\\';
      escaped += c;
    }
    return match(fmt::format("-m comment --comment \"{}\"", escaped));
  }
  /// `-m PROTO --dport N` (needs proto()).
  IptablesRuleSpec& dport(int port) { return match(fmt::format("-m {} --dport {}", proto_, port)); }
  /// A match as save prints it, e.g. "-m addrtype --dst-type LOCAL".
  IptablesRuleSpec& match(std::string_view text) {
    matches_ += ' ';
    matches_ += text;
    return *this;
  }
  IptablesRuleSpec& jump(std::string_view target) {
    target_ = fmt::format("-j {}", target);
    return *this;
  }
  /// The rule after "-A CHAIN ".
  std::string str() const {
    std::string out;
    auto add = [&out](std::string_view part) {
      if (part.empty()) return;
      if (!out.empty()) out += ' ';
      out += part;
    };
    add(src_);
    add(dst_);
    add(in_);
    if (!proto_.empty()) add("-p " + proto_);
    if (!matches_.empty()) add(std::string_view(matches_).substr(1));
    add(target_);
    return out;
  }

 private:
  std::string src_, dst_, in_, proto_, matches_, target_;
};

}  // namespace kproxy::backends
