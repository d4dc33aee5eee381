#!/usr/bin/env bash
# A Debian root file system that boots a real systemd (252 on bookworm) in systemd-nspawn, for the
# tests that run kcpshard as a systemd service (tests/e2e_systemd.rs). Prints its path.
#
# Cached in ${KCPSHARD_CACHE:-~/.cache/kcpshard}/rootfs-<key>, the key a hash of this script (its
# package list and set-up); built with debootstrap from the mirror the host's apt uses, in about a
# minute, when missing. A test never changes it: it boots it with systemd-nspawn --volatile=overlay
# (changes go to a tmpfs), so every run starts from the same machine.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cache=${KCPSHARD_CACHE:-$HOME/.cache/kcpshard}
suite=bookworm
# What the booted machine needs: systemd and logind (which starts the user manager of a user
# with lingering on, where kcpshard's units run), D-Bus (the system bus for logind, the user bus
# through which serve talks to its user manager), procps for the tests' checks, the PostgreSQL
# server for a managed PostgreSQL. kcp is static; kine and kcpshard need only the libc of the
# base system.
packages=systemd,systemd-sysv,dbus,dbus-user-session,libpam-systemd,procps,postgresql-15

key=$(sha256sum "$0" | cut -c1-12)
dir=$cache/rootfs-$suite-$key
if [ -x "$dir/lib/systemd/systemd" ] && [ -f "$dir/.kcpshard-ready" ]; then
  echo "$dir"
  exit 0
fi

say() { echo "systemd-rootfs: $*" >&2; }
die() { echo "systemd-rootfs: ERROR: $*" >&2; exit 1; }
command -v debootstrap >/dev/null || [ -x /usr/sbin/debootstrap ] || die "debootstrap is missing: apt-get install debootstrap (hack/install-deps.sh does)"
[ "$(id -u)" = 0 ] || die "debootstrap and systemd-nspawn need root"

# The mirror the host's apt uses (deb822 sources first, then sources.list).
mirror=$(
  { awk '/^URIs:/ { print $2; exit }' /etc/apt/sources.list.d/*.sources 2>/dev/null
    awk '$1 == "deb" && $0 !~ /security/ { for (i = 2; i <= NF; i++) if ($i ~ /^(https?|file):/) { print $i; exit } }' /etc/apt/sources.list 2>/dev/null
  } | grep -v security | head -1 || true
)
[ -n "$mirror" ] || die "cannot find the host's Debian mirror in /etc/apt/sources.list{,.d/*.sources}"

mkdir -p "$cache/logs"
tmp=$(mktemp -d "$cache/rootfs-build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
say "debootstrap $suite ($packages) into $tmp (log: $cache/logs/systemd-rootfs.log)"
start=$(date +%s)
/usr/sbin/debootstrap --variant=minbase --include="$packages" "$suite" "$tmp" "$mirror" \
  >"$cache/logs/systemd-rootfs.log" 2>&1 || { tail -30 "$cache/logs/systemd-rootfs.log" >&2; die "debootstrap failed"; }

# A machine of its own name, no consoles to wait for, no network set-up (it shares the host's).
echo kcpshard-test >"$tmp/etc/hostname"
: >"$tmp/etc/machine-id"
for unit in getty@tty1.service console-getty.service systemd-networkd.service systemd-resolved.service \
            systemd-timesyncd.service apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer fstrim.timer; do
  ln -sf /dev/null "$tmp/etc/systemd/system/$unit"
done
# The package's own cluster is not kcpshard's (a managed PostgreSQL makes its own): never start it.
rm -rf "$tmp/etc/postgresql/15/main" "$tmp/var/lib/postgresql/15/main"
ln -sf /dev/null "$tmp/etc/systemd/system/postgresql.service"
touch "$tmp/.kcpshard-ready"

rm -rf "$dir"
mv "$tmp" "$dir"
trap - EXIT
say "built $dir in $(( $(date +%s) - start ))s"
echo "$dir"
