#!/usr/bin/env bash
# Builds baton's Debian package from a staged tree with dpkg-deb:
#   /usr/bin/baton                        the binary, stripped
#   /usr/lib/baton/libonnxruntime.so      ONNX Runtime, from .baton/lib/
#   /usr/lib/baton/baton-stop             the unit's ExecStop (deploy/systemd/)
#   /lib/systemd/system/baton.service     deploy/systemd/baton.service
#   /etc/default/baton                    its options (a conffile, 0640;
#                                         the postinst gives it group baton)
#   /usr/share/doc/baton/                 docs/systemd.md
# and the maintainer scripts in deploy/debian/. Depends is computed from
# the binary's and the library's needs by dpkg-shlibdeps (package
# dpkg-dev), plus passwd for the postinst's useradd. docs/systemd.md says
# how to install it.
#
#   scripts/package-deb.sh [--binary PATH] [--runtime PATH] [--out DIR] [--version V]
#
# --binary defaults to target/release/baton (build it with
# `cargo build --release -p baton-server`), --runtime to
# .baton/lib/libonnxruntime.so (scripts/fetch-onnxruntime.sh fetches it),
# --out to target/deb; --version to the workspace's. Prints the package's
# path.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
binary="$root/target/release/baton"
runtime="$root/.baton/lib/libonnxruntime.so"
out="$root/target/deb"
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$root/Cargo.toml" | head -n1)
while [ $# -gt 0 ]; do
    case "$1" in
        --binary) binary=$2; shift 2 ;;
        --runtime) runtime=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        --version) version=$2; shift 2 ;;
        *) echo "usage: $0 [--binary PATH] [--runtime PATH] [--out DIR] [--version V]" >&2; exit 2 ;;
    esac
done
for need in dpkg-deb dpkg-shlibdeps strip; do
    command -v "$need" >/dev/null || { echo "$0: $need is needed (scripts/setup-packages.sh installs it)" >&2; exit 1; }
done
[ -x "$binary" ] || { echo "$0: no binary at $binary (--binary PATH)" >&2; exit 1; }
[ -e "$runtime" ] || { echo "$0: no ONNX Runtime at $runtime (scripts/fetch-onnxruntime.sh, or --runtime PATH)" >&2; exit 1; }

arch=$(dpkg --print-architecture)
mkdir -p "$out"
stage=$(mktemp -d "$out/stage.XXXXXX")
trap 'rm -rf "$stage"' EXIT
tree="$stage/baton"

install -d -m 755 "$tree/DEBIAN" "$tree/usr/bin" "$tree/usr/lib/baton" \
    "$tree/lib/systemd/system" "$tree/etc/default" "$tree/usr/share/doc/baton"
strip --strip-unneeded -o "$tree/usr/bin/baton" "$binary"
chmod 755 "$tree/usr/bin/baton"
# The library under its plain name: baton opens that path (the versioned
# file behind the symlink is copied, not the link).
install -m 644 "$(readlink -f "$runtime")" "$tree/usr/lib/baton/libonnxruntime.so"
install -m 755 "$root/deploy/systemd/baton-stop" "$tree/usr/lib/baton/baton-stop"
install -m 644 "$root/deploy/systemd/baton.service" "$tree/lib/systemd/system/baton.service"
install -m 640 "$root/deploy/systemd/baton.default" "$tree/etc/default/baton"
install -m 644 "$root/docs/systemd.md" "$tree/usr/share/doc/baton/systemd.md"
for script in postinst prerm postrm; do
    install -m 755 "$root/deploy/debian/$script" "$tree/DEBIAN/$script"
done
echo /etc/default/baton > "$tree/DEBIAN/conffiles"

# dpkg-shlibdeps reads the package's name from a debian/control.
mkdir -p "$stage/debian"
printf 'Source: baton\n\nPackage: baton\nArchitecture: any\n' > "$stage/debian/control"
shlibs=$(cd "$stage" && dpkg-shlibdeps -O --warnings=0 \
    baton/usr/bin/baton baton/usr/lib/baton/libonnxruntime.so | sed -n 's/^shlibs:Depends=//p')
[ -n "$shlibs" ] || { echo "$0: dpkg-shlibdeps found no dependencies" >&2; exit 1; }

size=$(du -sk --exclude=DEBIAN "$tree" | cut -f1)
cat > "$tree/DEBIAN/control" <<CONTROL
Package: baton
Version: $version
Architecture: $arch
Maintainer: baton developers <baton@localhost>
Installed-Size: $size
Depends: $shlibs, passwd
Section: net
Priority: optional
Description: model-inference server whose model updates are non-events
 baton serves ONNX models over the KServe V2 protocol (REST and gRPC) and
 swaps new versions in while traffic flows: fetched, verified, loaded,
 validated and warmed up before they serve. This package installs the
 server, its ONNX Runtime, and a hardened systemd unit whose reload
 replaces the binary without failing a request.
CONTROL

deb="$out/baton_${version}_${arch}.deb"
# Built beside, then renamed: a run beside this one never installs half a
# package.
dpkg-deb --root-owner-group -Zxz -z1 --build "$tree" "$stage/baton.deb" >/dev/null
mv "$stage/baton.deb" "$deb"
echo "$deb"
