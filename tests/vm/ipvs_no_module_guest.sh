#!/bin/sh
# Runs inside the test VM before a command that must find no IPVS: unloads the schedulers and
# ip_vs, and hides the modules so that neither the kernel nor modprobe can load them again.
set -e
for m in $(awk '$1 ~ /^ip_vs_/ { print $1 }' /proc/modules); do rmmod "$m"; done
rmmod ip_vs
mount -t tmpfs none /lib/modules
exec "$@"
