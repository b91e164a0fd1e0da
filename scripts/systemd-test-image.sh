#!/bin/sh
# Builds, once per machine, the image the systemd tests boot: Debian
# bookworm with systemd as PID 1 and the libraries baton's package depends
# on, made by mmdebstrap from Debian's packages (no image is pulled), and
# imported into podman. Prints the image's name.
#
# The root filesystem is cached in .baton/images/ and the image in podman's
# store, both named by a hash of this script, so a change to the package
# list builds a new one. Needs mmdebstrap and podman (scripts/setup-packages.sh
# installs them) and root, as podman runs rootful here.
set -eu

root=$(cd "$(dirname "$0")/.." && pwd)
suite=bookworm
# libc6, libgcc-s1 and libstdc++6 are what the package's Depends names
# (ONNX Runtime is C++); passwd gives useradd to the package's postinst.
packages=systemd,systemd-sysv,libc6,libgcc-s1,libstdc++6,passwd
key=$(sha256sum "$0" | cut -c1-12)
image="localhost/baton-systemd-test:$key"
# The flags every podman command of the tests takes on this kind of machine
# (crates/baton-testkit/src/podman.rs): a command without them may see
# another store configuration.
podman() { command podman --runtime runc --cgroup-manager cgroupfs "$@"; }

if podman image exists "$image"; then
    echo "$image"
    exit 0
fi
cache="$root/.baton/images"
mkdir -p "$cache"
# One build at a time on the machine; a run that waited finds the image.
exec 9>"$cache/systemd-test.lock"
flock 9
if podman image exists "$image"; then
    echo "$image"
    exit 0
fi
tar="$cache/systemd-test-$key.tar"
if [ ! -s "$tar" ]; then
    # Built under a name of its own, then renamed: a run beside this one
    # never reads half a file.
    part="$tar.$$.part"
    trap 'rm -f "$part"' EXIT
    mmdebstrap --quiet --format=tar --variant=minbase --include="$packages" "$suite" "$part" >&2
    mv "$part" "$tar"
fi
podman import --quiet --change 'CMD ["/sbin/init"]' "$tar" "$image" >&2
# Those of earlier versions of this script are not used any more. Without
# --force, podman keeps an image a container (of a run of another checkout,
# say) still uses.
for old in "$cache"/systemd-test-*.tar; do
    [ "$old" = "$tar" ] || rm -f "$old"
done
podman images --format '{{.Repository}}:{{.Tag}}' localhost/baton-systemd-test |
    grep -vx "$image" | xargs -r -n1 podman --runtime runc --cgroup-manager cgroupfs rmi >/dev/null 2>&1 || true
echo "$image"
