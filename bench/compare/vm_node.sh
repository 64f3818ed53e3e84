#!/bin/sh
# bench/compare's IPVS node, run as the command of the test VM (tests/vm/run-in-vm.sh, whose
# kernel has IPVS; the host's has none). compare.py boots the VM with qemu's user networking from
# inside the control plane's namespace: the guest is 10.255.0.2 and reaches the apiserver at
# 10.255.0.1, which qemu forwards to the control plane's loopback.
#
#   vm_node.sh WAIT_TOOL PROGRAM [ARG]...
#
# WAIT_TOOL is kproxy-bench-ipvswait (bench/compare/ipvs_wait.cpp).
# The program (kproxy or upstream kube-proxy, --proxy-mode=ipvs) starts when compare.py asks.
# compare.py asks through busybox httpd on 10.255.0.2:8000, forwarded to it by qemu:
#   /cgi-bin/q?start          start the program; prints its pid
#   /cgi-bin/q?count          lines of /proc/net/ip_vs, ipset members and iptables rules
#   /cgi-bin/q?wait&ARG…      WAIT_TOOL ARG…: streams "polling", then "seen REAL:PORT" lines
#   /cgi-bin/q?stat           the program's /proc/PID/status, then /proc/PID/stat
#   /cgi-bin/q?log            the program's output
#   /cgi-bin/q?dump           what the program programmed: ipvsadm -Ln, ipset list, iptables-save
#   /cgi-bin/q?heaptrack      the program's heaptrack data (compare.py --heaptrack), gzipped
#   /cgi-bin/q?stop           stop the program and power the VM off
set -u
[ $# -gt 1 ] || { echo "vm_node: usage: vm_node.sh WAIT_TOOL PROGRAM [ARG]..."; exit 2; }
echo "$1" >/run/wait_tool
shift
modprobe virtio_pci && modprobe virtio_net || { echo "vm_node: no virtio_net driver"; exit 1; }
ip link set eth0 up &&
  ip addr add 10.255.0.2/24 dev eth0 &&
  ip route add default via 10.255.0.1 || { echo "vm_node: no network"; exit 1; }
sysctl -q -w net.ipv4.ip_forward=1
# eth0's IPv6 link-local address comes seconds after the link under TCG (duplicate address
# detection): a node address change that would reach a program started before it.
i=0
while [ $i -lt 100 ]; do
  if ip -6 addr show dev eth0 scope link | grep -q inet6 && ! ip -6 addr show dev eth0 | grep -q tentative; then
    break
  fi
  sleep 0.1
  i=$((i + 1))
done

{
  echo '#!/bin/sh'
  echo 'export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root'
  printf 'exec'
  for a in "$@"; do printf " '%s'" "$a"; done
  echo
} >/run/prog.sh

mkdir -p /run/www/cgi-bin
cat >/run/www/cgi-bin/q <<'EOF'
#!/bin/sh
printf 'Content-Type: text/plain\r\n\r\n'
pid=$(cat /run/prog.pid 2>/dev/null)
case $QUERY_STRING in
  start)
    [ -z "$pid" ] || { echo "already started: $pid"; exit 0; }
    setsid sh /run/prog.sh </dev/null >/run/prog.log 2>&1 &
    echo $! >/run/prog.pid
    echo $! ;;
  count)
    # Everything IPVS mode programs: virtual and real servers, ipset members, iptables rules.
    # Upstream's first sync adds its ipset members one `ipset add` at a time after its virtual
    # servers, and restores its iptables rules last.
    echo $(($(wc -l </proc/net/ip_vs) +
            $(ipset list -t 2>/dev/null | awk '/^Number of entries:/ { n += $4 } END { print n + 0 }') +
            $(iptables-nft-save 2>/dev/null | grep -c '^-A') +
            $(iptables-legacy-save 2>/dev/null | grep -c '^-A'))) ;;
  wait\&*) exec "$(cat /run/wait_tool)" $(echo "${QUERY_STRING#wait&}" | tr '&' ' ') 2>&1 ;;
  stat) cat "/proc/$pid/status" && echo && cat "/proc/$pid/stat" ;;
  log) cat /run/prog.log ;;
  dump)
    ipvsadm -Ln
    ipset list
    iptables-nft-save
    iptables-legacy-save
    ip -o addr show dev kube-ipvs0 ;;
  heaptrack) gzip -c /run/heaptrack.raw ;;  # compare.py --heaptrack
  stop) touch /run/stop; echo stopping ;;
  *) echo "unknown query: $QUERY_STRING" ;;
esac
EOF
chmod 755 /run/www/cgi-bin/q
httpd -p 10.255.0.2:8000 -h /run/www || { echo "vm_node: httpd did not start"; exit 1; }
echo "vm_node: ready"

while [ ! -e /run/stop ]; do sleep 0.2; done
pid=$(cat /run/prog.pid 2>/dev/null)
if [ -n "$pid" ]; then
  kill -TERM "$pid" 2>/dev/null
  i=0
  while kill -0 "$pid" 2>/dev/null && [ $i -lt 100 ]; do sleep 0.2; i=$((i + 1)); done
  kill -KILL "$pid" 2>/dev/null
fi
echo "vm_node: stopped"
