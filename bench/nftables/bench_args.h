#pragma once
// Command-line helpers shared by the nftables benchmark programs.

#include <cstdlib>
#include <string>
#include <vector>

namespace kproxy::bench {

/// "1000,10000,30000" -> {1000, 10000, 30000}.
inline std::vector<int> parseList(const char* s) {
  std::vector<int> out;
  std::string str(s);
  std::size_t start = 0;
  while (start < str.size()) {
    auto comma = str.find(',', start);
    if (comma == std::string::npos) comma = str.size();
    out.push_back(std::atoi(str.substr(start, comma - start).c_str()));
    start = comma + 1;
  }
  return out;
}

}  // namespace kproxy::bench
