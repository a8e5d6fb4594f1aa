#!/usr/bin/env bash
# Build the simulated SGLang server image (dspark-ci/sglang-sim:latest) with no container registry:
#   1. a Debian root filesystem from Debian packages (debootstrap), imported as dspark-ci/debian-base:bookworm;
#   2. this project and its dependencies as wheels made here (pip wheel), installed with --no-index;
#   3. docker build of docker/Dockerfile on top of that base.
# The base tarball and the wheels are cached under $DSPARK_CACHE_DIR (default /var/cache/dspark-ci), and
# the image layers by the engine, so a second build takes seconds.
#
# usage: docker/build-sim-image.sh [--docker-host URL]
set -euo pipefail

usage() { sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
    case "$1" in
        --docker-host) export DOCKER_HOST="$2"; shift 2 ;;
        --docker-host=*) export DOCKER_HOST="${1#*=}"; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "build-sim-image.sh: unknown argument $1" >&2; usage >&2; exit 2 ;;
    esac
done

here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
cache=${DSPARK_CACHE_DIR:-/var/cache/dspark-ci}
base_image=${DSPARK_BASE_IMAGE:-dspark-ci/debian-base:bookworm}
sim_image=${DSPARK_SIM_IMAGE:-dspark-ci/sglang-sim:latest}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
suite=bookworm  # its python3 is 3.11: the wheels below are made for the same Python
base_tarball="$cache/debian-base-$suite.tar"
say() { echo "build-sim-image: $*" >&2; }

mkdir -p "$cache/wheels"
exec 9>"$cache/build.lock"
flock 9  # two builds at once would race on the cache

docker version --format '{{.Server.Version}}' >/dev/null 2>&1 || {
    say "no Docker engine answers at ${DOCKER_HOST:-the default socket}: start one (.ci/docker-up.sh)"; exit 3; }

python3 -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' || {
    say "the host's python3 is $(python3 -V 2>&1), the image's is 3.11: wheels with C extensions would not fit"; exit 3; }

# 1. Base image from Debian packages.
if docker image inspect "$base_image" >/dev/null 2>&1; then
    say "base image $base_image present"
else
    if [ ! -s "$base_tarball" ]; then
        command -v debootstrap >/dev/null || { say "debootstrap is missing: apt-get install -y debootstrap"; exit 3; }
        rootfs=$(mktemp -d /tmp/dspark-rootfs.XXXXXX)
        trap 'rm -rf "$rootfs"' EXIT
        say "debootstrap $suite (about a minute) from $mirror"
        debootstrap --variant=minbase --include=python3,python3-pip,ca-certificates "$suite" "$rootfs" "$mirror" \
            > "$cache/debootstrap.log" 2>&1 || { tail -n 20 "$cache/debootstrap.log" >&2; say "debootstrap failed"; exit 3; }
        rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
        tar -C "$rootfs" -c . > "$base_tarball.tmp"
        mv "$base_tarball.tmp" "$base_tarball"
        rm -rf "$rootfs"
    fi
    say "importing $base_tarball as $base_image"
    docker import --change 'ENV LANG=C.UTF-8' --change 'LABEL dspark-ci.image=debian-base' \
        --change 'CMD ["python3"]' - "$base_image" < "$base_tarball" >/dev/null
fi

# 2. Wheelhouse: this project's wheel, and exactly the dependency wheels it resolves to (from the cache
#    when it has them, from PyPI otherwise).
context=$(mktemp -d /tmp/dspark-sim-context.XXXXXX)
trap 'rm -rf "$context" ${rootfs:+"$rootfs"}' EXIT
mkdir -p "$context/project" "$context/wheels"
say "pip wheel: this project"
# A fixed timestamp makes the wheel (so the layer, so the image) identical while the code is.
SOURCE_DATE_EPOCH=315532800 python3 -m pip wheel -q --no-deps -w "$context/project" "$repo" >&2
project_wheel=$(ls "$context"/project/*.whl)
if ! python3 -m pip wheel -q --no-index --find-links "$cache/wheels" -w "$context/wheels" "$project_wheel" >/dev/null 2>&1; then
    say "pip wheel: dependencies (filling $cache/wheels)"
    python3 -m pip wheel -q --find-links "$cache/wheels" -w "$cache/wheels" "$project_wheel" >&2
    python3 -m pip wheel -q --no-index --find-links "$cache/wheels" -w "$context/wheels" "$project_wheel" >&2
fi
rm -f "$cache"/wheels/dspark_ci-*.whl "$context"/wheels/dspark_ci-*.whl
cp "$here/Dockerfile" "$context/Dockerfile"

# 3. The image (the classic builder: no buildx needed, and it keeps its layer cache per engine).
say "docker build $sim_image on ${DOCKER_HOST:-the default engine}"
# The code it runs, as a label: a launch refuses an image built from other code (launchers/docker/image_source.py).
source=$(cd "$repo" && python3 -m dspark_ci.launchers.docker.image_source)
DOCKER_BUILDKIT=0 docker build -q --build-arg "BASE=$base_image" --label "dspark-ci.source=$source" \
    -t "$sim_image" "$context" >&2
# Earlier builds of the image, now untagged, would pile up on every rebuild.
docker image prune -f --filter "label=dspark-ci.image=sglang-sim" >/dev/null
say "built $sim_image"
