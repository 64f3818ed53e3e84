#pragma once
// libnl reports its own error codes (NLE_*), which fold several errnos into one (ESRCH and
// ENOENT both become NLE_OBJ_NOTFOUND). The adapters capture the kernel's errno in an error
// callback; this maps what libnl reports when no kernel errno was seen (socket failures).

#include <cerrno>

#include <netlink/errno.h>

namespace kproxy::ipvs {

inline int errnoFromLibnl(int nle) {
  switch (nle < 0 ? -nle : nle) {
    case NLE_SUCCESS: return 0;
    case NLE_INTR: return EINTR;
    case NLE_BAD_SOCK: return EBADF;
    case NLE_AGAIN: return EAGAIN;
    case NLE_NOMEM: return ENOMEM;
    case NLE_EXIST: return EEXIST;
    case NLE_INVAL: return EINVAL;
    case NLE_RANGE: return ERANGE;
    case NLE_MSGSIZE: return EMSGSIZE;
    case NLE_OPNOTSUPP: return EOPNOTSUPP;
    case NLE_AF_NOSUPPORT: return EAFNOSUPPORT;
    case NLE_OBJ_NOTFOUND: return ENOENT;
    case NLE_NOATTR: return ENOENT;
    case NLE_PERM: return EPERM;
    case NLE_BUSY: return EBUSY;
    case NLE_PROTO_MISMATCH: return EPROTONOSUPPORT;
    case NLE_NOACCESS: return EACCES;
    case NLE_NODEV: return ENODEV;
    case NLE_NOADDR: return EADDRNOTAVAIL;
    case NLE_DUMP_INTR: return EINTR;
    default: return EIO;
  }
}

}  // namespace kproxy::ipvs
