// The plugin entry point: --proxy-mode=userspace.
#include "kproxy/plugin/sdk.h"
#include "kproxy/userspace/backend.h"

KPROXY_DEFINE_PLUGIN("userspace", "0.1.0",
                     "a TCP/UDP proxy in kproxy's process that retries refused endpoints; nftables redirects to it",
                     kproxy::userspace::makeUserspaceBackend)
