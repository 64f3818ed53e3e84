#pragma once
// The lines of `ipset save` output and `ipset restore` input, read alike by the tool adapter's
// parser and by FakeIpsets.

#include <string_view>

namespace kproxy::ipvs {

/// "add NAME ENTRY" → {"add", "NAME", "ENTRY"}: the first two words and the rest, trimmed.
struct IpsetLine {
  std::string_view verb, name, rest;
};
inline IpsetLine splitLine(std::string_view line) {
  auto word = [&line]() {
    while (!line.empty() && line.front() == ' ') line.remove_prefix(1);
    auto end = line.find(' ');
    std::string_view w = line.substr(0, end);
    line = end == std::string_view::npos ? std::string_view{} : line.substr(end);
    return w;
  };
  IpsetLine out;
  out.verb = word();
  out.name = word();
  while (!line.empty() && line.front() == ' ') line.remove_prefix(1);
  while (!line.empty() && (line.back() == ' ' || line.back() == '\r')) line.remove_suffix(1);
  out.rest = line;
  return out;
}

template <typename Fn>
void forEachLine(std::string_view text, Fn fn) {
  while (!text.empty()) {
    auto end = text.find('\n');
    fn(text.substr(0, end));
    text = end == std::string_view::npos ? std::string_view{} : text.substr(end + 1);
  }
}

}  // namespace kproxy::ipvs
