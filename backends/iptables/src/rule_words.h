#pragma once
// The words of a rule spec as iptables-save prints it, and the number formats in them. The
// tracer and the netlink encoder both parse the renderer's specs, with grammars of their own:
// the tracer turns what it cannot evaluate into an unknown match, the encoder refuses anything
// it does not write exactly as iptables-nft would. They share this cursor and these parsers.

#include <charconv>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kproxy/backends/common/iptables_save.h"

namespace kproxy::iptables {

/// A cursor over the words of one spec ("..." quoted words unquoted).
class RuleWords {
 public:
  explicit RuleWords(std::string_view spec) : words_(backends::splitIptablesWords(spec)) {}

  bool atEnd() const { return i_ >= words_.size(); }
  /// The current word; not at the end.
  const std::string& word() const { return words_[i_]; }
  void step() { ++i_; }
  /// The word after the current one (an option's value), which becomes the current one;
  /// nullopt at the end.
  std::optional<std::string_view> value() {
    if (i_ + 1 < words_.size()) return std::string_view(words_[++i_]);
    return std::nullopt;
  }
  /// The words after the current one (a target's options); the cursor is then at the end.
  std::vector<std::string_view> remaining() {
    std::vector<std::string_view> out;
    for (std::size_t k = i_ + 1; k < words_.size(); ++k) out.emplace_back(words_[k]);
    i_ = words_.size();
    return out;
  }
  /// Steps over the words after the current one that are neither options nor "!" (the
  /// arguments of an option not understood).
  void skipArguments() {
    while (i_ + 1 < words_.size() && !words_[i_ + 1].starts_with('-') && words_[i_ + 1] != "!") ++i_;
  }

 private:
  std::vector<std::string> words_;
  std::size_t i_ = 0;
};

/// "123" or "0x7b", the whole text.
inline std::optional<std::uint32_t> parseRuleNumber(std::string_view text) {
  int base = 10;
  if (text.starts_with("0x") || text.starts_with("0X")) {
    text.remove_prefix(2);
    base = 16;
  }
  std::uint32_t v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v, base);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty()) return std::nullopt;
  return v;
}

/// A port number, 0 to 65535.
inline std::optional<std::uint16_t> parseRulePort(std::string_view text) {
  auto v = parseRuleNumber(text);
  if (!v || *v > 65535) return std::nullopt;
  return static_cast<std::uint16_t>(*v);
}

/// "VALUE/MASK", or "VALUE" (the mask all ones), as marks are written.
inline std::optional<std::pair<std::uint32_t, std::uint32_t>> parseValueMask(std::string_view text) {
  const auto slash = text.find('/');
  auto v = parseRuleNumber(text.substr(0, slash));
  if (!v) return std::nullopt;
  if (slash == std::string_view::npos) return std::pair{*v, 0xffffffffu};
  auto m = parseRuleNumber(text.substr(slash + 1));
  if (!m) return std::nullopt;
  return std::pair{*v, *m};
}

}  // namespace kproxy::iptables
