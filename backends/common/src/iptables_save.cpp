#include "kproxy/backends/common/iptables_save.h"

#include <algorithm>
#include <charconv>
#include <optional>
#include <unordered_map>

namespace kproxy::backends {
namespace {

using core::ErrorCategory;
using core::makeError;

std::unexpected<core::Error> lineError(std::size_t line, std::string_view what) {
  return makeError(ErrorCategory::kDecode, "iptables-save line " + std::to_string(line) + ": " + std::string(what));
}

struct Counters {
  std::uint64_t packets = 0;
  std::uint64_t bytes = 0;
};

/// "[packets:bytes]" exactly, or nullopt.
std::optional<Counters> parseCounters(std::string_view text) {
  if (text.size() < 5 || text.front() != '[' || text.back() != ']') return std::nullopt;
  text = text.substr(1, text.size() - 2);
  const auto colon = text.find(':');
  if (colon == std::string_view::npos) return std::nullopt;
  auto number = [](std::string_view digits, std::uint64_t& out) {
    auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), out);
    return !digits.empty() && ec == std::errc{} && end == digits.data() + digits.size();
  };
  Counters c;
  if (!number(text.substr(0, colon), c.packets) || !number(text.substr(colon + 1), c.bytes)) return std::nullopt;
  return c;
}

}  // namespace

const IptablesChain* IptablesTable::findChain(std::string_view chain) const {
  auto it = std::find_if(chains.begin(), chains.end(), [chain](const auto& c) { return c.name == chain; });
  return it == chains.end() ? nullptr : &*it;
}

const IptablesTable* IptablesSave::findTable(std::string_view table) const {
  auto it = std::find_if(tables.begin(), tables.end(), [table](const auto& t) { return t.name == table; });
  return it == tables.end() ? nullptr : &*it;
}

core::Result<void> IptablesSaveReader::feed(std::string_view piece) {
  if (error_) return std::unexpected(*error_);
  while (!piece.empty()) {
    const auto end = piece.find('\n');
    if (end == std::string_view::npos) {
      partial_.append(piece);
      break;
    }
    core::Result<void> r;
    if (partial_.empty()) {
      r = line(piece.substr(0, end));
    } else {
      partial_.append(piece.substr(0, end));
      r = line(partial_);
      partial_.clear();
    }
    piece.remove_prefix(end + 1);
    if (!r) {
      error_ = r.error();
      return r;
    }
  }
  return {};
}

core::Result<void> IptablesSaveReader::finish() {
  if (error_) return std::unexpected(*error_);
  if (!partial_.empty()) {
    std::string last = std::move(partial_);
    partial_.clear();
    if (auto r = line(last); !r) {
      error_ = r.error();
      return r;
    }
  }
  if (inTable_) return lineError(tableLine_, "table " + tableName_ + " has no COMMIT");
  return {};
}

core::Result<void> IptablesSaveReader::line(std::string_view line) {
  ++lineNumber_;
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  if (line.empty() || line.front() == '#') return {};

  if (line.front() == '*') {
    if (inTable_) return lineError(lineNumber_, "table " + tableName_ + " has no COMMIT");
    const auto name = line.substr(1);
    if (name.empty() || name.find(' ') != std::string_view::npos) return lineError(lineNumber_, "bad table name");
    tableName_ = std::string(name);
    chainIndex_.clear();
    chainNames_.clear();
    inTable_ = true;
    tableLine_ = lineNumber_;
    sink_.table(tableName_);
    return {};
  }
  if (!inTable_) return lineError(lineNumber_, "outside a table: " + std::string(line.substr(0, 60)));

  if (line == "COMMIT") {
    inTable_ = false;
    return {};
  }
  if (line.front() == ':') {
    // ":NAME POLICY [packets:bytes]"
    auto words = splitIptablesWords(line.substr(1));
    if (words.size() != 3 || words[0].empty()) return lineError(lineNumber_, "bad chain line");
    const auto counters = parseCounters(words[2]);
    if (!counters) return lineError(lineNumber_, "bad counters " + words[2]);
    const std::size_t index = chainNames_.size();
    chainNames_.push_back(words[0]);
    if (!chainIndex_.emplace(chainNames_.back(), index).second) {
      chainNames_.pop_back();
      return lineError(lineNumber_, "chain " + words[0] + " declared twice");
    }
    sink_.chain(index, IptablesChain{std::move(words[0]), std::move(words[1]), counters->packets, counters->bytes, {}});
    return {};
  }
  IptablesRule rule;
  if (line.front() == '[') {
    const auto close = line.find(']');
    const auto counters = close == std::string_view::npos ? std::nullopt : parseCounters(line.substr(0, close + 1));
    if (!counters) return lineError(lineNumber_, "bad rule counters");
    rule.packets = counters->packets;
    rule.bytes = counters->bytes;
    line = line.substr(close + 1);
    while (line.starts_with(' ')) line.remove_prefix(1);
  }
  if (!line.starts_with("-A ")) return lineError(lineNumber_, "unexpected line: " + std::string(line.substr(0, 60)));
  line.remove_prefix(3);
  const auto space = line.find(' ');
  const std::string_view chainName = line.substr(0, space);
  const auto indexed = chainIndex_.find(chainName);
  if (indexed == chainIndex_.end()) return lineError(lineNumber_, "rule for undeclared chain " + std::string(chainName));
  rule.spec = space == std::string_view::npos ? std::string{} : std::string(line.substr(space + 1));
  sink_.rule(indexed->second, std::move(rule));
  return {};
}

core::Result<IptablesSave> parseIptablesSave(std::string_view text) {
  // Builds the whole save from the reader's pieces.
  struct Builder final : IptablesSaveReader::Sink {
    IptablesSave save;
    void table(std::string_view name) override { save.tables.push_back(IptablesTable{std::string(name), {}}); }
    void chain(std::size_t, IptablesChain chain) override { save.tables.back().chains.push_back(std::move(chain)); }
    void rule(std::size_t chainIndex, IptablesRule rule) override {
      save.tables.back().chains[chainIndex].rules.push_back(std::move(rule));
    }
  } builder;
  IptablesSaveReader reader(builder);
  if (auto r = reader.feed(text); !r) return std::unexpected(r.error());
  if (auto r = reader.finish(); !r) return std::unexpected(r.error());
  return std::move(builder.save);
}

std::vector<std::string> splitIptablesWords(std::string_view spec) {
  std::vector<std::string> out;
  std::size_t i = 0;
  while (i < spec.size()) {
    while (i < spec.size() && spec[i] == ' ') ++i;
    if (i >= spec.size()) break;
    std::string word;
    bool quoted = false;
    for (; i < spec.size() && (quoted || spec[i] != ' '); ++i) {
      if (spec[i] == '\\' && i + 1 < spec.size()) {
        word += spec[++i];
      } else if (spec[i] == '"') {
        quoted = !quoted;
      } else {
        word += spec[i];
      }
    }
    out.push_back(std::move(word));
  }
  return out;
}

std::string ruleJumpTarget(std::string_view spec) {
  const auto words = splitIptablesWords(spec);
  for (std::size_t i = 0; i + 1 < words.size(); ++i) {
    if (words[i] == "-j" || words[i] == "--jump" || words[i] == "-g" || words[i] == "--goto") return words[i + 1];
  }
  return {};
}

ChainRemoval planChainRemoval(const IptablesTable& table, const std::function<bool(std::string_view)>& owned) {
  ChainRemoval out;
  std::vector<std::string_view> names;
  for (const auto& chain : table.chains)
    if (!chain.builtin() && owned(chain.name)) {
      out.chains.push_back(chain.name);
      names.push_back(chain.name);
    }
  auto isRemoved = [&](std::string_view name) {
    for (auto n : names)
      if (n == name) return true;
    return false;
  };
  std::string deletes;
  for (const auto& chain : table.chains) {
    if (isRemoved(chain.name)) continue;
    for (const auto& rule : chain.rules) {
      if (!isRemoved(ruleJumpTarget(rule.spec))) continue;
      out.rules.push_back(chain.name + " " + rule.spec);
      deletes += "-D " + chain.name + " " + rule.spec + "\n";
    }
  }
  if (out.chains.empty() && deletes.empty()) return out;
  std::string text = "*" + table.name + "\n";
  // ":CHAIN - [0:0]" with --noflush flushes the chain, so rules between the removed chains
  // are gone before the deletes.
  for (const auto& chain : out.chains) text += ":" + chain + " - [0:0]\n";
  text += deletes;
  for (const auto& chain : out.chains) text += "-X " + chain + "\n";
  text += "COMMIT\n";
  out.input = std::move(text);
  return out;
}

}  // namespace kproxy::backends
