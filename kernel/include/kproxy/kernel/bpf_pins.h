#pragma once
/// Removing a directory of BPF pins (maps, programs, links) on a bpf filesystem: each pinned
/// link is detached first, so that its program leaves its hook even while another process
/// still holds the link open; then every pin goes, then the directory. No libbpf: the bpf()
/// syscall alone (cli links it for the mode switch and --cleanup).
/// Thread-safety: none needed (the kernel's).

#include <string>

#include "kproxy/core/error.h"

namespace kproxy::kernel {

/// Detaches the links pinned directly in `dir`, unlinks every entry of `dir` and removes it.
/// Whether `dir` existed; a missing `dir` is not an error. Subdirectories are left (then `dir`
/// stays, and the error says so).
core::Result<bool> removeBpfPins(const std::string& dir);

}  // namespace kproxy::kernel
