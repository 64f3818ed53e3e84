// KernelIpsets over the tool: ipset save / ipset restore -exist through the process runner.
#include "kproxy/ipvs/kernel.h"

#include <cerrno>
#include <chrono>
#include <optional>

#include <fmt/format.h>

#include "ipset_lines.h"

namespace kproxy::ipvs {
namespace {

constexpr std::chrono::seconds kIpsetTimeout{60};

std::string firstLine(std::string_view text) {
  while (!text.empty() && (text.front() == '\n' || text.front() == ' ')) text.remove_prefix(1);
  return std::string(text.substr(0, text.find('\n')));
}

class ProcessIpsets final : public KernelIpsets {
 public:
  ProcessIpsets(std::string tool, kernel::ProcessRunner& runner)
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
  kernel::ProcessRunner& runner_;
};

}  // namespace

core::Result<IpsetState> parseIpsetSave(std::string_view text) {
  IpsetState state;
  std::optional<core::Error> error;
  forEachLine(text, [&](std::string_view raw) {
    if (error) return;
    IpsetLine line = splitLine(raw);
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

core::Result<std::unique_ptr<KernelIpsets>> makeProcessIpsets(kernel::ProcessRunner& runner) {
  auto tool = kernel::findExecutable("ipset");
  if (!tool)
    return core::makeError(core::ErrorCategory::kNotFound,
                           "ipvs: the ipset program is not installed (IPVS mode needs it)", ENOENT);
  return std::unique_ptr<KernelIpsets>(std::make_unique<ProcessIpsets>(std::move(*tool), runner));
}

}  // namespace kproxy::ipvs
