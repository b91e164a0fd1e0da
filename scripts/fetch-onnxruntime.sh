#!/usr/bin/env bash
# Fetches the ONNX Runtime shared library that baton-onnx loads at run time,
# into <repo>/.baton/lib/libonnxruntime.so, and prints where it is.
# Idempotent: does nothing when the pinned version (or a library put there by
# hand) is already there.
#
# The library is taken from the official `onnxruntime` wheel on PyPI, so all
# this needs is python3 with pip (no unzip, no compiler).
#
# baton-onnx is built against the ONNX Runtime C API version 24 (ort's
# `api-24` feature), so any ONNX Runtime >= 1.24 serves it; the C API is
# backward-compatible. ORT_VERSION overrides the pinned version, and
# ORT_LIB_DIR the directory (default <repo>/.baton/lib): the tests fetch a
# second, older build into .baton/lib/second, the runtime a version in a
# worker process can name beside the server's own.
set -euo pipefail

ORT_VERSION="${ORT_VERSION:-1.32.0}"

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
lib_dir="${ORT_LIB_DIR:-$root/.baton/lib}"
target="$lib_dir/libonnxruntime.so"

IFS=. read -r major minor _ <<<"$ORT_VERSION"
if ! [[ "$major" =~ ^[0-9]+$ && "$minor" =~ ^[0-9]+$ ]] || ((major == 1 && minor < 24)) || ((major < 1)); then
    echo "fetch-onnxruntime: ORT_VERSION=$ORT_VERSION is not usable; baton needs ONNX Runtime 1.24 or newer" >&2
    exit 1
fi

if [[ -e "$target" ]]; then
    # A library put there by hand is left alone; a link this script made to
    # another version is replaced by the pinned one.
    current="$(readlink "$target" || true)"
    if [[ -z "$current" || "$current" == "libonnxruntime.so.$ORT_VERSION" ]]; then
        echo "ONNX Runtime is already at $target"
        exit 0
    fi
    echo "fetch-onnxruntime: replacing $current with ONNX Runtime $ORT_VERSION" >&2
fi

case "$(uname -m)" in
    x86_64 | amd64) arch=x86_64 ;;
    aarch64 | arm64) arch=aarch64 ;;
    *)
        echo "fetch-onnxruntime: unsupported machine $(uname -m); set ORT_DYLIB_PATH to a libonnxruntime.so instead" >&2
        exit 1
        ;;
esac

if ! python3 -m pip --version >/dev/null 2>&1; then
    echo "fetch-onnxruntime: needs python3 with pip (on Debian: apt-get install python3-pip)" >&2
    exit 1
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# The shared library in the wheel does not depend on the Python version, so a
# fixed cp311 wheel is requested: the same file whatever python3 runs pip.
python3 -m pip download --quiet --no-deps --only-binary=:all: \
    --implementation cp --python-version 3.11 --abi cp311 \
    --platform "manylinux_2_28_$arch" --platform "manylinux_2_27_$arch" \
    --platform "manylinux_2_17_$arch" --platform "manylinux2014_$arch" \
    "onnxruntime==$ORT_VERSION" -d "$tmp" >&2

mkdir -p "$lib_dir"
# Extracts onnxruntime/capi/libonnxruntime.so.<version> and prints its file name.
name="$(python3 - "$tmp" "$lib_dir" <<'EOF'
import glob, os, shutil, sys, zipfile

tmp, lib_dir = sys.argv[1], sys.argv[2]
wheels = glob.glob(os.path.join(tmp, "onnxruntime-*.whl"))
if len(wheels) != 1:
    sys.exit(f"fetch-onnxruntime: expected one onnxruntime wheel in {tmp}, found {wheels}")
with zipfile.ZipFile(wheels[0]) as wheel:
    members = [m for m in wheel.namelist()
               if m.startswith("onnxruntime/capi/libonnxruntime.so.")]
    if len(members) != 1:
        sys.exit(f"fetch-onnxruntime: no single libonnxruntime.so.* in {wheels[0]}: {members}")
    name = os.path.basename(members[0])
    partial = os.path.join(lib_dir, name + ".partial")
    with wheel.open(members[0]) as src, open(partial, "wb") as dst:
        shutil.copyfileobj(src, dst)
    os.chmod(partial, 0o755)
    os.replace(partial, os.path.join(lib_dir, name))
print(name)
EOF
)"

ln -sfn "$name" "$target"
# Versions this script fetched before; a running process keeps its mapping.
find "$lib_dir" -maxdepth 1 -name 'libonnxruntime.so.*' ! -name "$name" -delete
echo "ONNX Runtime $ORT_VERSION is at $target"
