#!/bin/bash
# Runs inside the test VM (tests/vm/run-in-vm.sh): proves that the guest kernel does IPVS, that it
# loads modules on demand, and that a request to a virtual address reaches a pod through IPVS.
# Prints one PASS or FAIL line per case and a closing "N passed, M failed" line; exits non-zero
# when any case fails.
set -uo pipefail

VIP=10.96.0.10
POD_IP=10.244.1.2
NODE_IP=10.244.1.1

read -r uptime _ </proc/uptime
echo "ipvs_smoke: the guest kernel had been up ${uptime} s when the test started"

passed=0
failed=0
# Each case runs in a subshell with errexit (not inside a condition, where bash would ignore
# errexit); its output is shown when it fails.
run_case() {
  local name=$1 log=/tmp/$1.log rc
  (set -e; "$name") >"$log" 2>&1
  rc=$?
  if ((rc == 0)); then
    echo "PASS $name"
    passed=$((passed + 1))
  else
    echo "FAIL $name (status $rc)"
    sed 's/^/    /' "$log"
    failed=$((failed + 1))
  fi
}

# /proc/net/ip_vs writes addresses and ports in hex: 10.96.0.10:80 is 0A60000A:0050.
hex_endpoint() {
  local ip=$1 port=$2 a b c d
  IFS=. read -r a b c d <<<"$ip"
  printf '%02X%02X%02X%02X:%04X' "$a" "$b" "$c" "$d" "$port"
}

ipvs_virtual_server_with_two_real_servers() {
  ip link add kube-ipvs0 type dummy
  ip addr add "$VIP/32" dev kube-ipvs0
  ipvsadm -A -t "$VIP:80" -s rr
  ipvsadm -a -t "$VIP:80" -r 10.244.9.2:8080 -m
  ipvsadm -a -t "$VIP:80" -r 10.244.9.3:8080 -m -w 2
  cat /proc/net/ip_vs
  grep -q "^TCP  $(hex_endpoint "$VIP" 80) rr" /proc/net/ip_vs || { echo "virtual server missing"; return 1; }
  grep -Eq -- "-> $(hex_endpoint 10.244.9.2 8080) +Masq +1 " /proc/net/ip_vs || { echo "real server 1 missing"; return 1; }
  grep -Eq -- "-> $(hex_endpoint 10.244.9.3 8080) +Masq +2 " /proc/net/ip_vs || { echo "real server 2 missing"; return 1; }
  ipvsadm -D -t "$VIP:80"
  ! grep -q "$(hex_endpoint "$VIP" 80)" /proc/net/ip_vs || { echo "virtual server still there after -D"; return 1; }
  ip link del kube-ipvs0
}

# The kernel runs /sbin/modprobe (busybox) for a scheduler or an nft expression not yet loaded.
modules_load_on_demand() {
  grep -q '^ip_vs_lc ' /proc/modules && { echo "ip_vs_lc already loaded: the case proves nothing"; return 1; }
  ipvsadm -A -t 10.96.0.11:80 -s lc
  grep -q '^ip_vs_lc ' /proc/modules || { echo "ip_vs_lc was not loaded"; return 1; }
  ipvsadm -D -t 10.96.0.11:80
  nft add table ip kproxy_smoke
  nft add chain ip kproxy_smoke post '{ type nat hook postrouting priority 100; }'
  nft add rule ip kproxy_smoke post ip daddr 10.244.0.0/16 masquerade
  grep -q '^nft_masq ' /proc/modules || { echo "nft_masq was not loaded"; return 1; }
  nft delete table ip kproxy_smoke
}

# wget_in NETNS URL: busybox wget from NETNS, bounded in time (Debian 12's static busybox wget
# crashes with its own -T).
wget_in() {
  ip netns exec "$1" timeout 5 busybox wget -q -O - "$2"
}

# A node namespace and a pod namespace joined by a veth pair; busybox httpd in the pod; an IPVS
# virtual server on the node's kube-ipvs0 whose real server is the pod; busybox wget on the node.
request_through_virtual_ip_reaches_pod() {
  ip netns add node
  ip netns add pod
  ip link add veth-pod netns node type veth peer name eth0 netns pod
  ip -n node link set lo up
  ip -n node link set veth-pod up
  ip -n node addr add "$NODE_IP/24" dev veth-pod
  ip -n pod link set lo up
  ip -n pod link set eth0 up
  ip -n pod addr add "$POD_IP/24" dev eth0
  ip -n pod route add default via "$NODE_IP"
  ip -n node link add kube-ipvs0 type dummy
  ip -n node addr add "$VIP/32" dev kube-ipvs0

  mkdir -p /srv/pod
  echo "hello from the pod" >/srv/pod/index.html
  ip netns exec pod busybox httpd -p 8080 -h /srv/pod

  for _ in $(seq 50); do
    wget_in node "http://$POD_IP:8080/" >/dev/null 2>&1 && break
    sleep 0.1
  done
  wget_in node "http://$POD_IP:8080/" || {
    echo "the pod does not answer on its own address"
    ip netns exec pod netstat -tln
    return 1
  }

  # Without a virtual server nothing answers on the virtual address: the pass below is IPVS's.
  if wget_in node "http://$VIP/" 2>/dev/null; then
    echo "$VIP answered before IPVS was programmed"
    return 1
  fi

  ip netns exec node ipvsadm -A -t "$VIP:80" -s rr
  ip netns exec node ipvsadm -a -t "$VIP:80" -r "$POD_IP:8080" -m
  ip netns exec node ipvsadm -Ln
  local reply
  reply=$(wget_in node "http://$VIP/") || { echo "no reply through $VIP"; return 1; }
  [[ $reply == "hello from the pod" ]] || { echo "unexpected reply: $reply"; return 1; }
  ip netns exec node ipvsadm -Ln --stats
  ip netns exec node ipvsadm -Lnc | grep -q "$POD_IP:8080" || { echo "IPVS holds no connection to the pod"; return 1; }
  # curl too, as the data-path tiers use it.
  reply=$(ip netns exec node curl -sS --max-time 5 "http://$VIP/") || { echo "curl: no reply through $VIP"; return 1; }
  [[ $reply == "hello from the pod" ]] || { echo "curl: unexpected reply: $reply"; return 1; }
}

run_case ipvs_virtual_server_with_two_real_servers
run_case modules_load_on_demand
run_case request_through_virtual_ip_reaches_pod

echo "$passed passed, $failed failed"
((failed == 0 && passed == 3))
