#!/usr/bin/env bash
# Build a real kube-apiserver (v1.20.2) from Debian 12's `kubernetes` SOURCE package, once per machine, and
# install Debian's etcd, for the Kubernetes launcher tests (level 2/3, see docs/K8S.md).
# Idempotent: every step leaves a stamp under the cache; a finished build is reused (prints its path, exits 0).
#
#   cache:   /var/cache/dspark-kube/           (DSPARK_KUBE_CACHE)
#   result:  /var/cache/dspark-kube/bin/kube-apiserver
#   etcd:    Debian's etcd-server (/usr/bin/etcd)
#
# Steps (the traps are the ones CLUSTERS.md lists):
#   1. apt-get source kubernetes through a PRIVATE sources list (a deb-src line for bookworm main), so the
#      system's apt configuration is untouched; the source tarball carries vendor/.
#   2. replace vendored modern-go/reflect2 1.0.1 (crashes on the first custom-resource write with Go 1.19) by
#      Debian's golang-github-modern-go-reflect2-dev 1.0.2.
#   3. make gen_openapi (needs rsync).
#   4. go build ./cmd/kube-apiserver in GOPATH mode (GO111MODULE=off) with Debian's Go; module mode fails with
#      "updates to go.mod needed".
# About 25 minutes cold on 2 cores. Log what it prints; the last line is the binary's path.
set -euo pipefail
cache=${DSPARK_KUBE_CACHE:-/var/cache/dspark-kube}
out=$cache/bin/kube-apiserver
stamps=$cache/stamps
gopath=$cache/gopath
src=$gopath/src/k8s.io/kubernetes
say() { echo "kube-build: $(date -u +%H:%M:%S) $*" >&2; }
mkdir -p "$cache" "$stamps" "$cache/bin"

# One build at a time on this machine (other checkouts may call this too).
exec 9>"$cache/.lock"
if ! flock -n 9; then say "another build holds $cache/.lock; waiting"; flock 9; fi

if [ -x "$out" ] && [ -f "$stamps/built" ]; then
    command -v etcd >/dev/null || { say "etcd missing"; }
    if command -v etcd >/dev/null; then say "cached: $out"; echo "$out"; exit 0; fi
fi

export DEBIAN_FRONTEND=noninteractive
apt_sys=(apt-get -o DPkg::Lock::Timeout=600)

# -- 0. build tools from Debian (system apt; the packages, not the sources, come from the normal lists)
need=()
command -v go >/dev/null || need+=(golang-go)
command -v rsync >/dev/null || need+=(rsync)
command -v make >/dev/null || need+=(make)
command -v dpkg-source >/dev/null || need+=(dpkg-dev)
command -v etcd >/dev/null || need+=(etcd-server)
[ -d /usr/share/gocode/src/github.com/modern-go/reflect2 ] || need+=(golang-github-modern-go-reflect2-dev)
if [ ${#need[@]} -gt 0 ]; then
    say "installing ${need[*]}"
    "${apt_sys[@]}" update -qq
    "${apt_sys[@]}" install -y -qq --no-install-recommends "${need[@]}"
fi
say "go: $(go version)"

# -- 1. the source package, through a private sources list
if [ ! -f "$stamps/source" ]; then
    apt_dir=$cache/apt
    mkdir -p "$apt_dir/lists/partial" "$apt_dir/parts" "$apt_dir/archives/partial" "$cache/dl"
    cat >"$apt_dir/sources.list" <<'LIST'
deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm main
LIST
    apt_priv=(apt-get -o Dir::Etc::SourceList="$apt_dir/sources.list" -o Dir::Etc::SourceParts="$apt_dir/parts"
              -o Dir::State::Lists="$apt_dir/lists" -o Dir::Cache::Archives="$apt_dir/archives")
    say "apt-get update (private deb-src list)"
    "${apt_priv[@]}" update -qq
    say "apt-get source kubernetes"
    rm -rf "$cache/dl" && mkdir -p "$cache/dl"
    (cd "$cache/dl" && "${apt_priv[@]}" source -qq kubernetes >&2)
    tree=$(find "$cache/dl" -mindepth 1 -maxdepth 1 -type d -name 'kubernetes-*' | head -1)
    [ -n "$tree" ] && [ -d "$tree/vendor" ] || { say "no unpacked tree with vendor/ in $cache/dl"; exit 1; }
    rm -rf "$src" && mkdir -p "$(dirname "$src")"
    mv "$tree" "$src"
    touch "$stamps/source"
    say "source at $src"
fi

# -- 2. reflect2 1.0.1 -> Debian's 1.0.2
if [ ! -f "$stamps/reflect2" ]; then
    v=$src/vendor/github.com/modern-go/reflect2
    [ -d "$v" ] || { say "no vendored reflect2 at $v"; exit 1; }
    rm -rf "$v" && mkdir -p "$v"
    cp -r /usr/share/gocode/src/github.com/modern-go/reflect2/. "$v/"
    touch "$stamps/reflect2"
    say "reflect2 replaced by Debian's $(dpkg-query -W -f='${Version}' golang-github-modern-go-reflect2-dev)"
fi

export GOPATH=$gopath GO111MODULE=off GOFLAGS= GOCACHE=$cache/gocache CGO_ENABLED=0
export GOMAXPROCS=${GOMAXPROCS:-2}

# -- 3. generated OpenAPI definitions
if [ ! -f "$stamps/openapi" ]; then
    say "make gen_openapi"
    (cd "$src" && make gen_openapi >&2)
    touch "$stamps/openapi"
fi

# -- 4. the binary, GOPATH mode
if [ ! -f "$stamps/built" ] || [ ! -x "$out" ]; then
    say "go build ./cmd/kube-apiserver (GOPATH mode; ~20 min cold)"
    (cd "$src" && go build -o "$out.tmp" ./cmd/kube-apiserver >&2)
    mv "$out.tmp" "$out"
    touch "$stamps/built"
fi
"$out" --version >&2 || true
say "done: $out"
echo "$out"
