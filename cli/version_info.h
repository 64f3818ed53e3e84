#pragma once
/// kproxy's version information, generated at build time from the top-level CMakeLists.txt
/// (project VERSION, KPROXY_KUBERNETES_VERSION) and git (cmake/version_info.cmake).

#include <string>

namespace kproxy::cli {

extern const char* const kKproxyVersion;      ///< "0.1.0"
extern const char* const kKproxyCommit;       ///< "3f2c1a9b0d4e", "-dirty" appended, or "unknown"
extern const char* const kKubernetesVersion;  ///< the kube-proxy release kproxy follows: "v1.34.4"

/// What `kproxy --version` prints: `kproxy 0.1.0 (commit 3f2c1a9b0d4e; follows Kubernetes v1.34.4)`.
inline std::string versionLine() {
  return std::string("kproxy ") + kKproxyVersion + " (commit " + kKproxyCommit + "; follows Kubernetes " +
         kKubernetesVersion + ")";
}

}  // namespace kproxy::cli
