#!/usr/bin/env bash
# Builds baton's container image from Debian packages, with no base image
# pulled: mmdebstrap makes a minimal root filesystem (libc, libstdc++, the CA
# certificates), and `podman build` adds the baton binary and its ONNX
# Runtime to it (deploy/container/Containerfile). See docs/container.md.
#
# Needs: podman (rootful, or rootless with subordinate ids), mmdebstrap,
# strip (binutils), flock (util-linux), sha256sum (coreutils); on Debian:
#   apt-get install podman runc mmdebstrap binutils
# The root filesystem is cached under .baton/images/, keyed by what goes into
# it (suite, mirror, packages, the extract hook), so a second build on one
# machine downloads nothing; --refresh-rootfs builds it again (for security
# updates).
set -euo pipefail

usage() {
    cat <<'EOF'
Usage: scripts/image.sh [OPTIONS]

  --binary PATH      the baton binary to put in the image (default:
                     target/release/baton, built with cargo if missing)
  --tag NAME         the image's name (default: localhost/baton:VERSION)
  --save PATH        also write the image to PATH as an OCI archive
  --suite NAME       the Debian suite of the root filesystem (default: bookworm)
  --mirror URL       a Debian mirror (default: deb.debian.org with the
                     suite's updates and security archives)
  --source URL       the image's org.opencontainers.image.source label
  --label KEY=VALUE  one more label on the image (repeatable)
  --refresh-rootfs   build the root filesystem again even if it is cached
  -h, --help         this text
EOF
}

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
binary="" tag="" save="" suite="bookworm" mirror="" source_url="" refresh=0 labels=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --binary) binary="${2:?--binary needs a path}"; shift 2 ;;
        --tag) tag="${2:?--tag needs a name}"; shift 2 ;;
        --save) save="${2:?--save needs a path}"; shift 2 ;;
        --suite) suite="${2:?--suite needs a name}"; shift 2 ;;
        --mirror) mirror="${2:?--mirror needs a URL}"; shift 2 ;;
        --source) source_url="${2:?--source needs a URL}"; shift 2 ;;
        --label) labels+=(--label "${2:?--label needs KEY=VALUE}"); shift 2 ;;
        --refresh-rootfs) refresh=1; shift ;;
        -h | --help) usage; exit 0 ;;
        *) echo "image.sh: unknown option $1" >&2; usage >&2; exit 2 ;;
    esac
done

fail() {
    echo "image.sh: $*" >&2
    exit 1
}

# Every tool, checked before anything is built, with what installs it.
need() {
    command -v "$1" >/dev/null 2>&1 || fail "needs $1, which is not installed (on Debian: apt-get install $2; or run scripts/setup-packages.sh)"
}
need podman podman
need mmdebstrap mmdebstrap
need strip binutils
need flock util-linux
need sha256sum coreutils

# The binary, stripped: the release build by default.
if [[ -z "$binary" ]]; then
    binary="$root/target/release/baton"
    if [[ ! -x "$binary" ]]; then
        echo "image.sh: building $binary" >&2
        (cd "$root" && CARGO_TARGET_DIR="$root/target" cargo build --release --locked -p baton-server)
    fi
fi
[[ -x "$binary" ]] || fail "no executable baton binary at $binary"
version="$("$binary" --version)" || fail "$binary --version failed"
version="${version#baton }"
[[ -n "$version" ]] || fail "$binary printed no version"
# Tags take [A-Za-z0-9_.-]: a stamped build's + becomes -.
[[ -n "$tag" ]] || tag="localhost/baton:${version//[^A-Za-z0-9_.-]/-}"

# ONNX Runtime: the library the tests and the demo use.
bash "$root/scripts/fetch-onnxruntime.sh" >&2
ort="$(readlink -f "$root/.baton/lib/libonnxruntime.so")"

# The root filesystem, cached by what goes into it.
cache="$root/.baton/images"
mkdir -p "$cache"
packages="libc6,libstdc++6,libgcc-s1,ca-certificates"
hook="$root/deploy/container/rootfs-hook.sh"
key="$(
    printf 'suite=%s\nmirror=%s\npackages=%s\narch=%s\n' "$suite" "$mirror" "$packages" "$(uname -m)"
    cat "$hook"
)"
key="$(sha256sum <<<"$key" | cut -c1-16)"
rootfs="$cache/rootfs-$suite-$key.tar"
(
    # One build at a time on this machine; the others wait, then reuse it.
    flock 9
    if [[ $refresh -eq 1 || ! -s "$rootfs" ]]; then
        echo "image.sh: building the root filesystem $rootfs" >&2
        # extract: unpack the packages and their dependencies, run no
        # maintainer script and install no dpkg (the image has no package
        # manager); the hook does what the scripts would have.
        mirrors=()
        [[ -z "$mirror" ]] || mirrors=("$mirror")
        partial="${rootfs%.tar}.partial.tar"
        rm -f "$partial"
        mmdebstrap --quiet --variant=extract --format=tar --include="$packages" --extract-hook="$hook" \
            "$suite" "$partial" "${mirrors[@]}" >&2
        # The device nodes mmdebstrap makes (as root): the runtime mounts its
        # own /dev, and a rootless build could not create them.
        tar --delete --wildcards --file "$partial" './dev/?*'
        mv "$partial" "$rootfs"
    fi
) 9>"$cache/rootfs.lock"

# The build context: what the Containerfile adds.
context="$(mktemp -d)"
trap 'rm -rf "$context"' EXIT
ln "$rootfs" "$context/rootfs.tar" 2>/dev/null || cp "$rootfs" "$context/rootfs.tar"
strip -o "$context/baton" "$binary"
cp "$ort" "$context/libonnxruntime.so"

revision="$(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)"
if [[ -z "$source_url" ]]; then
    # The checkout's origin, without any credentials in it.
    source_url="$(git -C "$root" remote get-url origin 2>/dev/null | sed -E 's#^([a-z+]+://)[^@/]*@#\1#' || true)"
fi
echo "image.sh: building $tag from $binary" >&2
previous="$(podman image inspect --format '{{.Id}}' "$tag" 2>/dev/null || true)"
podman build --quiet --pull=never --file "$root/deploy/container/Containerfile" \
    --build-arg "VERSION=$version" --build-arg "REVISION=$revision" --build-arg "SOURCE=$source_url" "${labels[@]}" \
    --tag "$tag" "$context" >/dev/null
# The image this tag named before, unless another tag or a container still
# uses it: rebuilding leaves nothing behind.
if [[ -n "$previous" && "$previous" != "$(podman image inspect --format '{{.Id}}' "$tag")" ]]; then
    podman rmi "$previous" >/dev/null 2>&1 || true
fi

if [[ -n "$save" ]]; then
    rm -f "$save"
    podman save --quiet --format oci-archive --output "$save" "$tag"
    echo "image.sh: saved $tag to $save ($(du -h "$save" | cut -f1))" >&2
fi
size="$(podman image inspect --format '{{.Size}}' "$tag")"
echo "image.sh: $tag is $((size / 1000000)) MB: baton $(($(stat -c %s "$context/baton") / 1000000)) MB, ONNX Runtime $(($(stat -c %s "$context/libonnxruntime.so") / 1000000)) MB, root filesystem $(($(stat -c %s "$rootfs") / 1000000)) MB (tar)" >&2
echo "$tag"
