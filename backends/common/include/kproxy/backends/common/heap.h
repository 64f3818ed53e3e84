#pragma once
/// Handing freed heap back to the system, for backends after their big syncs.

#ifdef __GLIBC__
#include <malloc.h>
#endif

namespace kproxy::backends {

/// Returns freed heap pages to the system. glibc keeps the freed memory of its arenas
/// resident; after a full sync that is hundreds of MiB at scale. Costs a walk of the heap, so
/// not for every small sync.
inline void releaseFreeHeap() {
#ifdef __GLIBC__
  malloc_trim(0);
#endif
}

}  // namespace kproxy::backends
