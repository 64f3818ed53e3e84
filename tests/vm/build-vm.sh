#!/usr/bin/env bash
# Builds the IPVS test VM: a Debian cloud kernel and an initramfs holding busybox, the netfilter,
# IPVS, dummy and veth modules, and the network tools a test needs (iproute2, nft, iptables,
# conntrack, curl, ipvsadm, ipset), each with its shared libraries.
#
#   tests/vm/build-vm.sh [--out DIR] [HOST_PATH[:GUEST_PATH]]...
#
# Prints two lines on stdout, `kernel=PATH` and `initrd=PATH`. Without arguments the initrd is the
# cached base image. With HOST_PATH arguments (files or directories; GUEST_PATH defaults to the
# absolute HOST_PATH) it writes DIR/initrd.cpio.gz: the base image followed by a second cpio
# archive with those files and the shared libraries of every ELF file among them (the kernel
# unpacks concatenated archives in order, later entries replacing earlier ones).
#
# The kernel package is the dependency of Debian's `linux-image-cloud-amd64` metapackage
# (or KPROXY_VM_KERNEL_PACKAGE, e.g. linux-image-6.1.0-56-cloud-amd64, to pin one). Packages
# are fetched with `apt-get download` and never installed on this machine. Everything is cached
# under ~/.cache/kproxy/vm (KPROXY_VM_CACHE), keyed by package versions and by this script's
# own contents, so only the first run downloads and builds.
set -euo pipefail

CACHE=${KPROXY_VM_CACHE:-$HOME/.cache/kproxy/vm}
SELF=$(readlink -f "${BASH_SOURCE[0]}")
OUT=""
FILES=()

die() { echo "build-vm: ERROR: $*" >&2; exit 1; }
# Scratch directories, removed however the script ends.
SCRATCH=()
trap 'rm -rf "${SCRATCH[@]}"' EXIT
log() { echo "build-vm: $*" >&2; }

while (($#)); do
  case $1 in
    --out) OUT=${2:?--out needs a directory}; shift 2 ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$SELF"; exit 0 ;;
    --) shift; FILES+=("$@"); break ;;
    -*) die "unknown option $1" ;;
    *) FILES+=("$1"); shift ;;
  esac
done
if ((${#FILES[@]})) && [[ -z $OUT ]]; then
  die "files given without --out DIR"
fi

for tool in apt-get apt-cache dpkg-deb depmod modprobe cpio gzip ldd; do
  command -v "$tool" >/dev/null || die "'$tool' is missing; run scripts/install-deps.sh (it installs cpio, kmod)"
done

mkdir -p "$CACHE/debs"
# One builder at a time: ctest may start several VM tests at once.
exec 9>"$CACHE/.lock"
flock 9

APT_OPTS=(-o APT::Sandbox::User=root -qq)
apt_updated=0
apt_update_once() {
  if ((apt_updated == 0)); then
    log "apt-get update"
    apt-get update "${APT_OPTS[@]}" >&2 || die "apt-get update failed"
    apt_updated=1
  fi
}

# Candidate versions of every package needed, from one apt-cache call (each call reads the whole
# package cache: a third of a second).
declare -A VERSION
KERNEL_PKG=${KPROXY_VM_KERNEL_PACKAGE:-}
# ipvsadm and ipset are fetched, not installed, with the libraries this machine lacks (libnl and
# libmnl come with the build dependencies).
EXTRA_PKGS=(ipvsadm libpopt0 ipset libipset13)
WANTED=(linux-image-cloud-amd64 busybox-static "${EXTRA_PKGS[@]}" ${KERNEL_PKG:+"$KERNEL_PKG"})
read_versions() {
  local out
  out=$(apt-cache show --no-all-versions "${WANTED[@]}" 2>/dev/null) || return 1
  eval "$(awk '
    /^Package: / { p = $2 }
    /^Version: / { printf "VERSION[%s]=%s\n", p, $2 }
    /^Depends: / && p == "linux-image-cloud-amd64" && match($0, /linux-image-[^ ,]+ \(= [^)]+\)/) {
      split(substr($0, RSTART, RLENGTH), d, /[ ()=]+/); printf "META_KERNEL=%s\nMETA_KERNEL_VERSION=%s\n", d[1], d[2] }
  ' <<<"$out")"
}
META_KERNEL="" META_KERNEL_VERSION=""
if ! read_versions; then
  apt_update_once
  read_versions || die "apt-cache does not know ${WANTED[*]}"
fi
if [[ -z $KERNEL_PKG ]]; then
  [[ -n $META_KERNEL ]] || die "cannot resolve linux-image-cloud-amd64's kernel package (apt-cache show)"
  KERNEL_PKG=$META_KERNEL
  VERSION[$KERNEL_PKG]=$META_KERNEL_VERSION
fi

# fetch_deb PACKAGE: prints the path of the cached .deb of PACKAGE's candidate version.
fetch_deb() {
  local pkg=$1 version=${VERSION[$1]:-} deb tmp
  [[ -n $version ]] || die "no Debian package '$pkg' is known to apt (apt-cache show $pkg)"
  deb="$CACHE/debs/${pkg}_${version//:/%3a}_amd64.deb"
  if [[ ! -s $deb ]]; then
    log "downloading $pkg $version"
    tmp=$(mktemp -d "$CACHE/debs/.dl.XXXXXX")
    SCRATCH+=("$tmp")
    if ! (cd "$tmp" && apt-get download "${APT_OPTS[@]}" "$pkg=$version" >&2); then
      # The lists may name a version the mirror no longer has.
      apt_update_once
      (cd "$tmp" && apt-get download "${APT_OPTS[@]}" "$pkg=$version" >&2) || die "apt-get download $pkg=$version failed"
    fi
    mv "$tmp"/*.deb "$deb"
    rmdir "$tmp"
  fi
  echo "$deb"
}

KVER=${KERNEL_PKG#linux-image-}
[[ $KVER =~ ^[0-9] ]] || die "unexpected kernel package name '$KERNEL_PKG'"
KERNEL_DEB=$(fetch_deb "$KERNEL_PKG")
BUSYBOX_DEB=$(fetch_deb busybox-static)
EXTRA_DEBS=()
for pkg in "${EXTRA_PKGS[@]}"; do
  EXTRA_DEBS+=("$(fetch_deb "$pkg")")
done

# --- kernel: vmlinuz and the module subset ------------------------------------------------------
# MODULE_SET names the subset below: a new one extracts the kernel again.
MODULE_SET=2
KDIR="$CACHE/kernel-$(basename "$KERNEL_DEB" .deb)-m$MODULE_SET"
if [[ ! -s $KDIR/vmlinuz ]]; then
  log "extracting $(basename "$KERNEL_DEB")"
  tmp=$(mktemp -d "$CACHE/.kernel.XXXXXX")
  SCRATCH+=("$tmp")
  dpkg-deb -x "$KERNEL_DEB" "$tmp/root"
  mods="$tmp/root/lib/modules/$KVER"
  [[ -d $mods ]] || die "$KERNEL_DEB has no lib/modules/$KVER"
  depmod -b "$tmp/root" "$KVER"
  # Every netfilter module (nftables, iptables, conntrack, IPVS, ipset), the bridge (for
  # br_netfilter), dummy and veth, and virtio's network card (bench/compare's IPVS node, which
  # reaches the apiserver through qemu's user networking); modprobe adds what they depend on.
  seeds=$(cd "$mods" && find kernel/net/netfilter kernel/net/ipv4/netfilter kernel/net/ipv6/netfilter \
            kernel/net/bridge kernel/drivers/net/dummy.ko kernel/drivers/net/veth.ko \
            kernel/drivers/net/virtio_net.ko kernel/drivers/virtio/virtio_pci.ko -name '*.ko*' |
          sed 's|.*/||; s|\.ko.*$||' | sort -u)
  mkdir -p "$tmp/out/modules/$KVER"
  for m in $seeds; do
    modprobe -d "$tmp/root" -S "$KVER" --show-depends "$m" | awk '$1 == "insmod" { print $2 }'
  done | sort -u | while read -r path; do
    rel=${path#"$tmp/root/lib/modules/$KVER/"}
    mkdir -p "$tmp/out/modules/$KVER/$(dirname "$rel")"
    cp "$path" "$tmp/out/modules/$KVER/$rel"
  done
  cp "$mods"/modules.builtin "$mods"/modules.builtin.modinfo "$mods"/modules.order "$tmp/out/modules/$KVER/"
  for m in ip_vs ip_vs_rr dummy veth nf_conntrack nf_tables virtio_net virtio_pci; do
    find "$tmp/out/modules/$KVER" -name "$m.ko*" | grep -q . || die "module $m is not in $KERNEL_PKG"
  done
  cp "$tmp/root/boot/vmlinuz-$KVER" "$tmp/out/vmlinuz"
  cp "$tmp/root/boot/config-$KVER" "$tmp/out/config"
  echo "$KERNEL_PKG $(dpkg-deb -f "$KERNEL_DEB" Version)" >"$tmp/out/VERSION"
  rm -rf "$KDIR"
  mv "$tmp/out" "$KDIR"
  # Kernels extracted with another module set go.
  find "$CACHE" -maxdepth 1 -name "kernel-*" ! -path "$KDIR" ! -name ".*" -exec rm -rf {} +
  rm -rf "$tmp"
fi

# --- base initramfs -----------------------------------------------------------------------------
# Tools copied from this machine (installed by scripts/install-deps.sh), with their libraries.
# dash is /bin/sh: Debian's busybox shell runs its own applets before PATH (its `ip` for
# iproute2's, say); bash is there for the test scripts.
HOST_TOOLS=(/usr/bin/dash /usr/bin/bash /usr/sbin/ip /usr/sbin/nft /usr/sbin/xtables-nft-multi
            /usr/sbin/xtables-legacy-multi /usr/sbin/conntrack /usr/bin/curl)
HOST_PACKAGES=(dash bash iproute2 nftables iptables conntrack curl libc6)
for t in "${HOST_TOOLS[@]}"; do
  [[ -x $t ]] || die "$t is missing; run scripts/install-deps.sh"
done

key_material() {
  cat "$SELF"
  basename "$KDIR"
  for d in "$BUSYBOX_DEB" "${EXTRA_DEBS[@]}"; do basename "$d"; done
  dpkg-query -W -f='${Package}=${Version}\n' "${HOST_PACKAGES[@]}" 2>/dev/null
}
BASE_KEY=$(key_material | sha256sum | cut -c1-16)
BASE="$CACHE/base-$KVER-$BASE_KEY.cpio.gz"

# is_elf FILE
is_elf() { [[ -f $1 ]] && [[ $(head -c4 "$1" | od -An -c | tr -d ' ') == '177ELF' ]]; }

# copy_with_libs STAGE SRC DEST [LIBROOT...]: copies SRC to STAGE/DEST and, for an ELF file, every
# library `ldd` resolves for it (LIBROOTs are extracted packages searched first) to the path it
# has on this machine, or inside its LIBROOT, plus the dynamic loader.
copy_with_libs() {
  local stage=$1 src=$2 dest=$3; shift 3
  local libpath="" root
  for root in "$@"; do
    libpath+="$root/usr/lib/x86_64-linux-gnu:$root/lib/x86_64-linux-gnu:"
  done
  mkdir -p "$stage/$(dirname "$dest")"
  cp -L "$src" "$stage/$dest"
  is_elf "$src" || return 0
  local out lib rel
  out=$(LD_LIBRARY_PATH=${libpath%:} ldd "$src" 2>&1) || {
    [[ $out == *"not a dynamic executable"* || $out == *"statically linked"* ]] && return 0
    die "ldd $src: $out"
  }
  if grep -q "not found" <<<"$out"; then
    die "ldd $src: missing libraries:"$'\n'"$(grep "not found" <<<"$out")"
  fi
  while read -r lib; do
    [[ -n $lib ]] || continue
    rel=$lib
    for root in "$@"; do
      [[ $lib == "$root"/* ]] && rel=${lib#"$root"}
    done
    [[ -e $stage/$rel ]] && continue
    mkdir -p "$stage/$(dirname "$rel")"
    cp -L "$lib" "$stage/$rel"
  done < <(awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' <<<"$out")
}

# make_cpio DIR OUT: a reproducible newc archive, gzip-compressed.
make_cpio() {
  find "$1" -exec touch -h -d @0 {} +
  (cd "$1" && find . -mindepth 1 -print0 | LC_ALL=C sort -z |
     cpio --null --create --format=newc --owner=0:0 --reproducible --quiet) | gzip -n -6 >"$2"
}

if [[ ! -s $BASE ]]; then
  log "building base initramfs for $KVER"
  tmp=$(mktemp -d "$CACHE/.base.XXXXXX")
  SCRATCH+=("$tmp")
  R="$tmp/root"
  # A merged-/usr layout, as on Debian 12, so that host library paths resolve either way.
  mkdir -p "$R"/usr/{bin,sbin,lib/x86_64-linux-gnu,lib64} "$R"/{proc,sys,dev,run,tmp,root,etc,var,mnt}
  ln -s usr/bin "$R/bin"; ln -s usr/sbin "$R/sbin"; ln -s usr/lib "$R/lib"; ln -s usr/lib64 "$R/lib64"
  ln -s ../run "$R/var/run"
  chmod 1777 "$R/tmp"

  dpkg-deb -x "$BUSYBOX_DEB" "$tmp/busybox"
  cp "$tmp/busybox/bin/busybox" "$R/usr/bin/busybox"
  # Every applet as a symlink, modprobe among them: the kernel runs /sbin/modprobe to load
  # IPVS schedulers and nftables expressions on demand.
  "$R/usr/bin/busybox" --list-full | while read -r applet; do
    applet=${applet#usr/}
    [[ -e $R/usr/$applet || -L $R/usr/$applet ]] || ln -s /usr/bin/busybox "$R/usr/$applet"
  done
  [[ -L $R/usr/sbin/modprobe ]] || die "busybox has no modprobe applet"

  for t in "${HOST_TOOLS[@]}"; do
    # No busybox applet of the same name anywhere on PATH.
    rm -f "$R/usr/bin/${t##*/}" "$R/usr/sbin/${t##*/}"
    copy_with_libs "$R" "$t" "$t"
  done
  ln -sf dash "$R/usr/bin/sh"
  # iptables, iptables-nft, iptables-legacy, their -save/-restore and the ip6 ones, as here.
  for link in /usr/sbin/*tables*; do
    target=$(readlink -f "$link")
    case $(basename "$target") in
      xtables-nft-multi|xtables-legacy-multi)
        [[ $link == "$target" ]] || { rm -f "$R$link"; ln -s "$(basename "$target")" "$R$link"; } ;;
    esac
  done
  # iptables' matches and targets are plugins it opens at run time.
  xt=/usr/lib/x86_64-linux-gnu/xtables
  for so in "$xt"/*.so; do
    copy_with_libs "$R" "$so" "$so"
  done

  for d in "${EXTRA_DEBS[@]}"; do dpkg-deb -x "$d" "$tmp/extra"; done
  for t in /sbin/ipvsadm /sbin/ipset; do
    src=$tmp/extra$t
    [[ -f $src ]] || src=$tmp/extra/usr$t
    [[ -f $src ]] || die "$t is not in the fetched packages"
    rm -f "$R/usr/bin/${t##*/}" "$R/usr/sbin/${t##*/}"
    copy_with_libs "$R" "$src" "/usr$t" "$tmp/extra"
  done

  mkdir -p "$R/usr/lib/modules"
  cp -a "$KDIR/modules/$KVER" "$R/usr/lib/modules/"
  depmod -b "$R" "$KVER"

  for f in /etc/protocols /etc/services /etc/ethertypes; do
    [[ -f $f ]] && cp "$f" "$R$f"
  done
  printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$R/etc/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\n' >"$R/etc/group"
  printf '127.0.0.1 localhost\n::1 localhost\n' >"$R/etc/hosts"
  echo kproxy-vm >"$R/etc/hostname"

  cat >"$R/init" <<'EOF'
#!/bin/sh
# PID 1 of the kproxy test VM: mounts, loads modules, runs /kproxy-vm/command (added by
# run-in-vm.sh), reports its exit status on the console, powers off.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin HOME=/root TERM=dumb
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /run
mount -t tmpfs tmpfs /dev/shm
exec </dev/console >/dev/console 2>&1
mkdir -p /run/netns
hostname kproxy-vm
# The kernel asks /sbin/modprobe for modules it needs later (schedulers, nft expressions).
echo /sbin/modprobe >/proc/sys/kernel/modprobe
for m in ip_vs ip_vs_rr ip_vs_wrr ip_vs_sh nf_conntrack nf_nat nf_tables nft_chain_nat \
         ip_tables iptable_nat iptable_filter ip_set dummy veth; do
  modprobe "$m" || echo "kproxy-vm: WARNING: modprobe $m failed"
done
ip link set lo up
# Kernel messages would interleave with the command's output.
dmesg -n 1
nonce=$(cat /kproxy-vm/nonce 2>/dev/null)
if [ -x /kproxy-vm/command ]; then
  echo "KPROXY-VM-BEGIN-$nonce"
  cd /root
  /kproxy-vm/command
  rc=$?
else
  echo "KPROXY-VM-BEGIN-$nonce"
  echo "kproxy-vm: no /kproxy-vm/command in the initramfs"
  rc=127
fi
echo "KPROXY-VM-EXIT-$nonce=$rc"
sync
poweroff -f
EOF
  chmod 755 "$R/init"

  make_cpio "$R" "$tmp/base.cpio.gz"
  mv "$tmp/base.cpio.gz" "$BASE"
  # Older base images of the same kernel are replaced by this one.
  find "$CACHE" -maxdepth 1 -name "base-$KVER-*.cpio.gz" ! -path "$BASE" -delete
  log "base initramfs: $BASE ($(du -h "$BASE" | cut -f1))"
fi

flock -u 9

# --- per-run overlay ----------------------------------------------------------------------------
INITRD=$BASE
if ((${#FILES[@]})); then
  mkdir -p "$OUT"
  overlay=$(mktemp -d "$OUT/.overlay.XXXXXX")
  SCRATCH+=("$overlay")
  # The same merged-/usr layout as the base, so that library paths land in the same place.
  mkdir -p "$overlay"/usr/{bin,sbin,lib,lib64}
  ln -s usr/bin "$overlay/bin"; ln -s usr/sbin "$overlay/sbin"; ln -s usr/lib "$overlay/lib"; ln -s usr/lib64 "$overlay/lib64"
  for spec in "${FILES[@]}"; do
    host=${spec%%:*}
    guest=${spec#*:}
    [[ $spec == *:* ]] || guest=""
    [[ -e $host ]] || die "no such file: $host"
    [[ -n $guest ]] || guest=$(readlink -f "$host")
    [[ $guest == /* ]] || die "guest path must be absolute: $guest"
    if [[ -d $host ]]; then
      while IFS= read -r -d '' f; do
        copy_with_libs "$overlay" "$f" "$guest/${f#"$host"/}"
      done < <(find "$host" -type f -print0)
    else
      copy_with_libs "$overlay" "$host" "$guest"
    fi
  done
  # The symlinks exist in the base already; an archive entry would replace them with itself.
  rm "$overlay"/{bin,sbin,lib,lib64}
  make_cpio "$overlay" "$OUT/overlay.cpio.gz"
  cat "$BASE" "$OUT/overlay.cpio.gz" >"$OUT/initrd.cpio.gz"
  rm -f "$OUT/overlay.cpio.gz"
  INITRD="$OUT/initrd.cpio.gz"
fi

echo "kernel=$KDIR/vmlinuz"
echo "initrd=$INITRD"
