// KernelSysctls over the files under /proc/sys (backends::SysctlFiles).
#include "kproxy/backends/common/sysctl.h"
#include "kproxy/ipvs/kernel.h"

namespace kproxy::ipvs {
namespace {

class FileSysctls final : public KernelSysctls {
 public:
  explicit FileSysctls(std::string root) : files_(std::move(root)) {}
  core::Result<std::int64_t> readInt(const std::string& name) override { return files_.readInt(name); }
  core::Result<void> writeInt(const std::string& name, std::int64_t value) override {
    return files_.writeInt(name, value);
  }

 private:
  backends::SysctlFiles files_;
};

}  // namespace

std::unique_ptr<KernelSysctls> makeFileSysctls(std::string root) {
  return std::make_unique<FileSysctls>(std::move(root));
}

}  // namespace kproxy::ipvs
