#pragma once
// Private: whether a plugin file may be loaded into a process that runs as root. As the
// kernel's module loader and sudo do, a file only its owner can change, owned by someone we
// already trust, in directories that only trusted owners can change.

#include <sys/types.h>

#include <filesystem>
#include <vector>

#include "kproxy/core/error.h"

namespace kproxy::plugins::detail {

/// root, the effective user, and the owner of the running executable (who could replace kproxy
/// itself, so trusting their plugins adds nothing).
std::vector<uid_t> trustedOwners();

/// Checks `path` (resolved through symlinks) and every directory above it: each must be owned
/// by one of `owners` and not writable by group or others; a directory with the sticky bit (as
/// /tmp) may be writable by others, who cannot rename or replace what they do not own there.
/// kPlugin names the offending path, its owner or mode, and what is required.
core::Result<void> checkTrustedPath(const std::filesystem::path& path, const std::vector<uid_t>& owners);

}  // namespace kproxy::plugins::detail
