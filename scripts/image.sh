#!/usr/bin/env bash
# Builds baton's container image from Debian packages, with no base image
# pulled: mmdebstrap makes a minimal root filesystem (libc, libstdc++, the CA
# certificates), and `podman build` adds the baton binary and its ONNX
# Runtime to it (deploy/container/Containerfile). See docs/container.md.
#
# Needs: podman (rootful, or rootless with subordinate ids), mmdebstrap,
# Debian's archive keys, strip and objdump (binutils), dpkg-deb (dpkg), flock
# (util-linux), sha256sum (coreutils); on Debian:
#   apt-get install podman runc mmdebstrap binutils debian-archive-keyring
# The root filesystem is cached under .baton/images/ (or $BATON_IMAGE_CACHE),
# keyed by what goes into it (suite, mirrors, packages, the hook, the
# post-processing), and built again once it is older than --rootfs-max-age
# days (7), so that Debian's security updates come in; --refresh-rootfs
# builds it again at once.
set -euo pipefail

usage() {
    cat <<'EOF'
Usage: scripts/image.sh [OPTIONS]

  --binary PATH      the baton binary to put in the image (default:
                     target/release/baton, which `cargo build --release
                     --locked -p baton-server` brings up to date first)
  --tag NAME         the image's name (default: localhost/baton:VERSION)
  --save PATH        also write the image to PATH as an OCI archive
  --suite NAME       the Debian suite of the root filesystem (default: bookworm)
  --mirror URL       a Debian mirror, or a whole sources line ("deb URL
                     SUITE main"); repeatable. Given, it replaces the
                     default (deb.debian.org with the suite's -updates and
                     -security archives): name those too, as sources lines
  --source URL       the image's org.opencontainers.image.source label
  --label KEY=VALUE  one more label on the image (repeatable)
  --refresh-rootfs   build the root filesystem again even if it is cached
  --rootfs-max-age DAYS
                     build the cached root filesystem again once it is this
                     old (default: 7)
  -h, --help         this text
EOF
}

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
binary="" tag="" save="" suite="bookworm" source_url="" refresh=0 max_age_days=7 labels=() mirrors=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --binary) binary="${2:?--binary needs a path}"; shift 2 ;;
        --tag) tag="${2:?--tag needs a name}"; shift 2 ;;
        --save) save="${2:?--save needs a path}"; shift 2 ;;
        --suite) suite="${2:?--suite needs a name}"; shift 2 ;;
        --mirror) mirrors+=("${2:?--mirror needs a URL}"); shift 2 ;;
        --source) source_url="${2:?--source needs a URL}"; shift 2 ;;
        --label) labels+=(--label "${2:?--label needs KEY=VALUE}"); shift 2 ;;
        --refresh-rootfs) refresh=1; shift ;;
        --rootfs-max-age) max_age_days="${2:?--rootfs-max-age needs a number of days}"; shift 2 ;;
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
need objdump binutils
need dpkg-deb dpkg
need flock util-linux
need sha256sum coreutils
# mmdebstrap checks the archive's signatures with Debian's keys; without
# them (a host that is not Debian) it fails deep inside apt.
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
[[ -s "$keyring" ]] || fail "needs Debian's archive keys ($keyring), which are not installed (on Debian: apt-get install debian-archive-keyring; elsewhere, your distribution's debian-archive-keyring package)"
[[ "$max_age_days" =~ ^[0-9]+$ ]] || fail "--rootfs-max-age takes a whole number of days, not $max_age_days"

# The binary, stripped: the release build by default, built every time (a
# no-op when it is current), so that the image never ships an old binary
# under the checkout's commit.
if [[ -z "$binary" ]]; then
    target="${CARGO_TARGET_DIR:-$root/target}"
    binary="$target/release/baton"
    echo "image.sh: building $binary (cargo build --release --locked -p baton-server)" >&2
    (cd "$root" && CARGO_TARGET_DIR="$target" cargo build --release --locked -p baton-server) >&2 ||
        fail "cargo build --release --locked -p baton-server failed"
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
cache="${BATON_IMAGE_CACHE:-$root/.baton/images}"
mkdir -p "$cache"
# base-files: /etc/os-release and /etc/debian_version, which scanners read
# to know the distribution.
packages="libc6,libstdc++6,libgcc-s1,ca-certificates,base-files"
hook="$root/deploy/container/rootfs-hook.sh"
# extract: unpack the packages and their dependencies, run no maintainer
# script and install no dpkg (the image has no package manager); the hook
# does what the scripts would have, and removes apt's configuration, which
# mmdebstrap's own clean-up would otherwise trip on (cleanup/mmdebstrap
# removes only its apt.conf.d file, which goes with /etc/apt).
mmdebstrap_options=(--quiet --variant=extract --format=tar --skip=cleanup/mmdebstrap --include="$packages")
# What image.sh does to mmdebstrap's tar: the device nodes it makes (as
# root) go, since the runtime mounts its own /dev and a rootless build
# could not create them.
postprocess() {
    tar --delete --wildcards --file "$1" './dev/?*'
}
key="$(
    printf 'suite=%s\npackages=%s\narch=%s\n' "$suite" "$packages" "$(uname -m)"
    printf 'mirror=%s\n' "${mirrors[@]}"
    printf 'option=%s\n' "${mmdebstrap_options[@]}"
    declare -f postprocess
    cat "$hook"
)"
key="$(sha256sum <<<"$key" | cut -c1-16)"
rootfs="$cache/rootfs-$suite-$key.tar"
(
    # One build at a time on this machine; the others wait, then reuse it.
    flock 9
    rebuild=$refresh
    if [[ -s "$rootfs" ]]; then
        age=$(($(date +%s) - $(stat -c %Y "$rootfs")))
        echo "image.sh: the cached root filesystem $rootfs is $((age / 86400)) days $((age % 86400 / 3600)) hours old (rebuilt after $max_age_days days)" >&2
        if [[ $age -ge $((max_age_days * 86400)) ]]; then
            echo "image.sh: the root filesystem is older than $max_age_days days: building it again, with Debian's updates" >&2
            rebuild=1
        fi
    else
        rebuild=1
    fi
    if [[ $rebuild -eq 1 ]]; then
        echo "image.sh: building the root filesystem $rootfs" >&2
        partial="${rootfs%.tar}.partial.tar"
        rm -f "$partial"
        mmdebstrap "${mmdebstrap_options[@]}" --extract-hook="$hook" "$suite" "$partial" "${mirrors[@]}" >&2
        postprocess "$partial"
        mv "$partial" "$rootfs"
    fi
) 9>"$cache/rootfs.lock"

# The C and C++ runtime baton and ONNX Runtime were linked against, checked
# against the root filesystem's: a binary built on a newer system than the
# suite (say glibc 2.36 against bullseye's 2.31) would not start in the
# image. Every library each needs (NEEDED) must be there, and define every
# symbol version each asks of it (GLIBC_2.34, GLIBCXX_3.4.30, GCC_4.2.0...).
libs="$(mktemp -d)"
tar -tf "$rootfs" | grep -E '^\./(usr/)?lib[^/]*/([^/]+/)?[^/]+\.so(\.[0-9.]+)?$' >"$libs/list" || true
tar -xf "$rootfs" -C "$libs" --files-from "$libs/list" 2>/dev/null || true
# "LIB VERSION" per line, what FILE asks of LIB.
references() {
    objdump -p "$1" | awk '
        /^Version References:/ { refs = 1; next }
        refs && /^[^ \t]/ { refs = 0 }
        refs && /required from/ { lib = $3; sub(/:$/, "", lib); next }
        refs && NF == 4 { print lib, $4 }
        /^  NEEDED/ { print $2, "-" }'
}
# The versions LIB defines.
definitions() {
    objdump -p "$1" | awk '/^Version definitions:/ { defs = 1; next } defs && /^[^0-9\t]/ { defs = 0 } defs && /^[0-9]+ 0x/ { print $4 }'
}
libc6="$(tar -xOf "$rootfs" ./var/lib/dpkg/status 2>/dev/null | awk '/^Package: / { p = $2 } /^Version: / && p == "libc6" { print $2 }')"
missing=()
for file in "$binary" "$ort"; do
    while read -r lib version; do
        [[ "$lib" == libonnxruntime.so* ]] && continue
        found="$(find "$libs" -name "$lib" -print -quit)"
        if [[ -z "$found" ]]; then
            missing+=("$(basename "$file") needs $lib, which the root filesystem lacks")
        elif [[ "$version" != - ]] && ! definitions "$found" | grep -qxF "$version"; then
            missing+=("$(basename "$file") needs $version of $lib, which the root filesystem's lacks")
        fi
    done < <(references "$file" | sort -u -V)
done
rm -rf "$libs"
if [[ ${#missing[@]} -gt 0 ]]; then
    printf 'image.sh: %s\n' "${missing[@]}" >&2
    fail "$binary or ONNX Runtime was built against a newer C or C++ runtime than $suite's (libc6 ${libc6:-unknown}), so the image could not start: build baton on (or in a container of) $suite or older, or choose a newer --suite"
fi

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
