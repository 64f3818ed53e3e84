#!/usr/bin/env bash
# The older kproxy of the cluster suite's kproxy-upgrade scenario: kproxy and its backend plugins
# (nftables, and those KC_OLD_PLUGINS names, e.g. "iptables") built from the commit
# tests/cluster/old-kproxy.commit names (or COMMIT), taken from the history of the clone this
# script is in, once, into ~/.cache/kproxy/cluster-old/<commit>/.
#
# usage: [KC_OLD_PLUGINS="iptables ..."] tests/cluster/old-kproxy.sh [COMMIT]
#
# Prints that directory on stdout; it holds `kproxy`, `plugins/kproxy-backend-<mode>.so`
# (the --plugin-dir to give it) and `build-info` (the commit, `kproxy --version`, what the build
# took). A run that finds the directory with every plugin asked for builds nothing; one that
# lacks a plugin builds the directory again with all of them.
#
# The build: `git archive` of the commit into <commit>.partial/src, configured as scripts/test.sh
# configures the Release build (Release, KPROXY_WERROR=ON, Ninja; tests off) in src/build, the
# same layout relative to the source as the main build's, so that through ccache
# (CCACHE_BASEDIR at that source, CCACHE_NOHASHDIR=1, CCACHE_DIR ~/.cache/kproxy/ccache unless
# set) every file the commit shares with a tree already built is a cache hit. Only the targets
# `kproxy` and the plugins' (`kproxy-backend-nftables`, ...) are built. The files are copied into a scratch
# directory that is renamed to <commit>/ once complete: a failed or interrupted build leaves no
# <commit>/ (its leftovers are removed by the next build), and the directory is trusted only
# because it exists. One build at a time (a lock in the cache directory).
#
# Fails, and says why, when the clone lacks the commit (a shallow clone: fetch it, or
# `git fetch --unshallow`) and the cache has no build of it, or the build fails (its log's last
# lines are shown).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
CACHE_ROOT=${KPROXY_CACHE:-$HOME/.cache/kproxy}
CACHE=$CACHE_ROOT/cluster-old
JOBS=${JOBS:-2}

log() { echo "old-kproxy: $*" >&2; }
die() {
  log "ERROR: $*"
  exit 1
}

# The one commit line of old-kproxy.commit.
commit_of_file() {
  local lines
  mapfile -t lines < <(grep -Ev '^[[:space:]]*(#|$)' "$HERE/old-kproxy.commit")
  ((${#lines[@]} == 1)) || die "$HERE/old-kproxy.commit must hold exactly one commit line (it has ${#lines[@]})"
  echo "${lines[0]}"
}

WANT=${1:-$(commit_of_file)}
# nftables always (the suite's default mode), so that asking for more never loses it.
PLUGINS=(nftables)
TARGETS=(kproxy kproxy-backend-nftables)
for p in ${KC_OLD_PLUGINS:-}; do
  [[ "$p" =~ ^(nftables|iptables|ipvs|userspace|ebpf)$ ]] || die "KC_OLD_PLUGINS: no backend named '$p'"
  [[ " ${PLUGINS[*]} " == *" $p "* ]] && continue
  PLUGINS+=("$p")
  TARGETS+=("kproxy-backend-$p")
done
complete() {
  local p
  [[ -x "$1/kproxy" && -f "$1/build-info" ]] || return 1
  for p in "${PLUGINS[@]}"; do [[ -f "$1/plugins/kproxy-backend-$p.so" ]] || return 1; done
}
# A build already in the cache needs no history: a shallow clone runs on a machine that has it.
for dir in "$CACHE/$WANT"*; do
  if [[ ! "$dir" =~ \.(partial|tmp\.[0-9]+)$ ]] && complete "$dir"; then
    echo "$dir"
    exit 0
  fi
done
git -C "$REPO" rev-parse --git-dir >/dev/null 2>&1 ||
  die "$REPO is not a git clone: the older kproxy (commit $WANT) is built from the clone's own history"
COMMIT=$(git -C "$REPO" rev-parse --verify --quiet "$WANT^{commit}") ||
  die "the clone at $REPO lacks commit $WANT, the older kproxy of scenario kproxy-upgrade$(
    [[ "$(git -C "$REPO" rev-parse --is-shallow-repository)" == true ]] && echo " (it is a shallow clone)"
  ): run 'git -C $REPO fetch --unshallow' (or fetch that commit) and run again"
OUT=$CACHE/$COMMIT

if complete "$OUT"; then
  echo "$OUT"
  exit 0
fi

command -v ninja >/dev/null || die "ninja is missing; run scripts/install-deps.sh"
mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
if ! flock -n 9; then
  log "another run is building an older kproxy: waiting for it"
  flock 9
fi
if complete "$OUT"; then
  echo "$OUT"
  exit 0
fi
[[ ! -e "$OUT" ]] || {
  # The plugins it holds are built again too: runs in different modes do not take turns
  # rebuilding the directory.
  for so in "$OUT"/plugins/kproxy-backend-*.so; do
    [[ -f "$so" ]] || continue
    p=${so##*/kproxy-backend-}
    p=${p%.so}
    [[ " ${PLUGINS[*]} " == *" $p "* ]] && continue
    PLUGINS+=("$p")
    TARGETS+=("kproxy-backend-$p")
  done
  log "removing $OUT: it lacks some of its files"
  rm -rf "$OUT"
}

# A fixed work path for the commit: what the build embeds of it (the plugin loader's build-tree
# default) is the same every time, so a rebuild hits the cache for those files too.
WORK=$CACHE/$COMMIT.partial
STAGE=$CACHE/$COMMIT.tmp.$$
rm -rf "$WORK" "$CACHE"/*.tmp.*
trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$WORK/src"
log "building kproxy $COMMIT (${TARGETS[*]}) in $WORK; log: $WORK/build.log"
start=$SECONDS
git -C "$REPO" archive --format=tar "$COMMIT" | tar -x -C "$WORK/src" || die "git archive $COMMIT failed"

(
  cd "$WORK/src"
  export CCACHE_DIR=${CCACHE_DIR:-$CACHE_ROOT/ccache} CCACHE_BASEDIR=$WORK/src CCACHE_NOHASHDIR=1
  # This build's hits and misses alone, without touching the shared cache's counters.
  export CCACHE_STATSLOG=$WORK/ccache-stats.log
  mkdir -p "$CCACHE_DIR"
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DKPROXY_WERROR=ON -DKPROXY_BUILD_TESTS=OFF \
    -DKPROXY_GIT_COMMIT="${COMMIT:0:12}" &&
    nice -n 5 cmake --build build -j"$JOBS" --target "${TARGETS[@]}"
) >"$WORK/build.log" 2>&1 || {
  tail -25 "$WORK/build.log" >&2
  die "building kproxy $COMMIT failed after $((SECONDS - start)) s (log: $WORK/build.log)"
}
took=$((SECONDS - start))
stats=$(CCACHE_STATSLOG=$WORK/ccache-stats.log ccache --show-log-stats 2>/dev/null |
  awk '/Hits:|Misses:/ { printf "%s%s %s", sep, $1, $2; sep = ", " }') || true

mkdir -p "$STAGE/plugins"
cp "$WORK/src/build/cli/kproxy" "$STAGE/kproxy"
for p in "${PLUGINS[@]}"; do cp "$WORK/src/build/plugins-out/kproxy-backend-$p.so" "$STAGE/plugins/"; done
version=$("$STAGE/kproxy" --version) || die "the built kproxy does not run: $STAGE/kproxy --version"
cat >"$STAGE/build-info" <<EOF
commit $COMMIT
version $version
built $(date -u +%FT%TZ) in $took s (ccache: ${stats:-no statistics})
compiler $(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' "$WORK/src/build/CMakeCache.txt")
EOF
mv -T "$STAGE" "$OUT"
rm -rf "$WORK"
log "built kproxy $COMMIT in $took s (ccache: ${stats:-no statistics}): $OUT"
echo "$OUT"
