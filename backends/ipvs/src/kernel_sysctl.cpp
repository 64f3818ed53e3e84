// KernelSysctls over the files under /proc/sys (kernel::SysctlFiles).
#include "kproxy/ipvs/kernel.h"
#include "kproxy/kernel/sysctl.h"

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
  kernel::SysctlFiles files_;
};

}  // namespace

std::unique_ptr<KernelSysctls> makeFileSysctls(std::string root) {
  return std::make_unique<FileSysctls>(std::move(root));
}

}  // namespace kproxy::ipvs
