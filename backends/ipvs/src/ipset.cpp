// ipset save / ipset restore through the process runner, and the in-memory fake.
#include "kproxy/ipvs/ipset.h"

#include <cerrno>
#include <chrono>
#include <optional>

#include <fmt/format.h>

namespace kproxy::ipvs {
namespace {

constexpr std::chrono::seconds kIpsetTimeout{60};

/// "add NAME ENTRY" → {"add", "NAME", "ENTRY"}: the first two words and the rest, trimmed.
struct Line {
  std::string_view verb, name, rest;
};
Line splitLine(std::string_view line) {
  auto word = [&line]() {
    while (!line.empty() && line.front() == ' ') line.remove_prefix(1);
    auto end = line.find(' ');
    std::string_view w = line.substr(0, end);
    line = end == std::string_view::npos ? std::string_view{} : line.substr(end);
    return w;
  };
  Line out;
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

std::string firstLine(std::string_view text) {
  while (!text.empty() && (text.front() == '\n' || text.front() == ' ')) text.remove_prefix(1);
  return std::string(text.substr(0, text.find('\n')));
}

class ProcessIpsets final : public KernelIpsets {
 public:
  ProcessIpsets(std::string tool, backends::ProcessRunner& runner)
      : tool_(std::move(tool)), runner_(runner) {}

  core::Result<IpsetState> save() override {
    auto ran = runner_.run({tool_, "save"}, {.stdinData = {}, .timeout = kIpsetTimeout});
    if (!ran) return std::unexpected(ran.error());
    if (!ran->succeeded())
      return core::makeError(core::ErrorCategory::kKernel, "ipset save: " + firstLine(ran->err));
    return parseIpsetSave(ran->out);
  }

  core::Result<void> restore(std::string_view input) override {
    if (input.empty()) return {};
    auto ran =
        runner_.run({tool_, "restore", "-exist"}, {.stdinData = input, .timeout = kIpsetTimeout});
    if (!ran) return std::unexpected(ran.error());
    if (!ran->succeeded())
      return core::makeError(core::ErrorCategory::kKernel, "ipset restore: " + firstLine(ran->err));
    return {};
  }

  std::string describe() const override { return tool_; }

 private:
  std::string tool_;
  backends::ProcessRunner& runner_;
};

}  // namespace

core::Result<IpsetState> parseIpsetSave(std::string_view text) {
  IpsetState state;
  std::optional<core::Error> error;
  forEachLine(text, [&](std::string_view raw) {
    if (error) return;
    Line line = splitLine(raw);
    if (line.verb == "create") {
      state.sets[std::string(line.name)].createLine = std::string(raw);
    } else if (line.verb == "add") {
      auto it = state.sets.find(std::string(line.name));
      if (it == state.sets.end()) {
        error = core::Error{
            core::ErrorCategory::kDecode, 0,
            fmt::format("ipset save: entry of set {} before its create line", line.name)};
        return;
      }
      it->second.entries.emplace(line.rest);
    }
  });
  if (error) return std::unexpected(*error);
  return state;
}

core::Result<std::unique_ptr<KernelIpsets>> makeProcessIpsets(backends::ProcessRunner& runner) {
  auto tool = backends::findExecutable("ipset");
  if (!tool)
    return core::makeError(core::ErrorCategory::kNotFound,
                           "ipvs: the ipset program is not installed (IPVS mode needs it)", ENOENT);
  return std::unique_ptr<KernelIpsets>(std::make_unique<ProcessIpsets>(std::move(*tool), runner));
}

core::Result<IpsetState> FakeIpsets::save() { return state; }

core::Result<void> FakeIpsets::restore(std::string_view input) {
  restores.emplace_back(input);
  if (refuseNext) {
    refuseNext = false;
    return core::makeError(core::ErrorCategory::kKernel, "ipset restore: refused (fake)");
  }
  IpsetState next = state;
  std::optional<core::Error> error;
  std::size_t number = 0;
  forEachLine(input, [&](std::string_view raw) {
    ++number;
    if (error || raw.empty()) return;
    Line line = splitLine(raw);
    const std::string name(line.name);
    auto refuse = [&](std::string_view why) {
      error = core::Error{core::ErrorCategory::kKernel, 0,
                          fmt::format("ipset restore: line {}: {} (fake)", number, why)};
    };
    if (line.verb == "create") {
      next.sets.try_emplace(name).first->second.createLine = std::string(raw);
      return;
    }
    auto it = next.sets.find(name);
    if (it == next.sets.end()) return refuse("The set with the given name does not exist");
    if (line.verb == "add")
      it->second.entries.emplace(line.rest);
    else if (line.verb == "del")
      it->second.entries.erase(std::string(line.rest));
    else if (line.verb == "flush")
      it->second.entries.clear();
    else if (line.verb == "destroy")
      next.sets.erase(it);
    else
      refuse("unknown command");
  });
  if (error) return std::unexpected(*error);
  state = std::move(next);
  return {};
}

}  // namespace kproxy::ipvs
