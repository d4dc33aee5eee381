#!/usr/bin/env bash
# Build github.com/kcp-dev/kcp/cmd/kcp at VERSION from the Go module in hack/kcp/VERSION
# into ~/.cache/kcpshard/bin/kcp-VERSION, with kcp's own version ldflags (see kcp's Makefile).
# Usage: hack/build-kcp.sh VERSION
set -euo pipefail
version=${1:?usage: hack/build-kcp.sh VERSION}
root=$(cd "$(dirname "$0")/.." && pwd)
moddir=$root/hack/kcp/$version
cache=${KCPSHARD_CACHE:-$HOME/.cache/kcpshard}
[ -f "$moddir/go.mod" ] || { echo "build-kcp: no $moddir/go.mod" >&2; exit 1; }
mkdir -p "$cache/bin" "$cache/logs"
cd "$moddir"
# Several github.com/kcp-dev/* pseudo-versions are unknown to the checksum database reachable here;
# go.sum in this directory pins their hashes instead.
export GONOSUMDB=${GONOSUMDB:+$GONOSUMDB,}github.com/kcp-dev
export GOFLAGS="${GOFLAGS:-} -mod=readonly"
export CGO_ENABLED=0
kube=$(go list -m -f '{{.Version}}' k8s.io/kubernetes)   # required version, e.g. v1.36.0
major=$(echo "$kube" | sed 's/^v\([0-9]*\).*/\1/')
minor=$(echo "$kube" | sed 's/^v[0-9]*\.\([0-9]*\).*/\1/')
gitver="$kube+kcp-$version"
date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
ld=""
for p in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
  ld="$ld -X $p.gitCommit=$version -X $p.gitTreeState=clean -X $p.gitVersion=$gitver"
  ld="$ld -X $p.gitMajor=$major -X $p.gitMinor=$minor -X $p.buildDate=$date"
done
out=$cache/bin/kcp-$version
go build -trimpath -ldflags "-s -w $ld" -o "$out.tmp" github.com/kcp-dev/kcp/cmd/kcp
mv -f "$out.tmp" "$out"
echo "$out"
