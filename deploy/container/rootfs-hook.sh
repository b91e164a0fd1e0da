#!/bin/sh
# mmdebstrap's extract hook for baton's image: runs once the Debian packages
# are unpacked into the root filesystem at "$1", before it is packed.
#
# The extract variant runs no maintainer scripts, so what they would have
# made is made here: the certificate bundle (ca-certificates' postinst) and
# the users. What baton never uses is removed: documentation, iconv's
# converters (gconv), and OpenSSL, which ca-certificates depends on only to
# run its postinst (baton's TLS is rustls, reading the bundle).
# dpkg's database is written from the packages unpacked, so that scanners
# see which Debian packages (and versions) the image holds; apt's
# configuration is removed, since it names the build's mirror (with any
# credentials in its URL) and nothing in the image runs apt.
# Part of the rootfs cache key: scripts/image.sh hashes this file.
set -eu
root="$1"

# The bundle update-ca-certificates would write, which rustls-native-certs
# (object stores over HTTPS) reads.
mkdir -p "$root/etc/ssl/certs"
find "$root/usr/share/ca-certificates" -name '*.crt' | LC_ALL=C sort | while read -r cert; do
    cat "$cert"
    # Some files lack a final newline; keep the PEM blocks apart.
    [ -z "$(tail -c 1 "$cert")" ] || echo
done >"$root/etc/ssl/certs/ca-certificates.crt"
[ -s "$root/etc/ssl/certs/ca-certificates.crt" ] || { echo "rootfs-hook: no certificates found" >&2; exit 1; }

# Users: root, nobody, and baton (10001), which the image runs as.
cat >"$root/etc/passwd" <<'PASSWD'
root:x:0:0:root:/root:/usr/sbin/nologin
baton:x:10001:10001:baton:/var/lib/baton:/usr/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin
PASSWD
cat >"$root/etc/group" <<'GROUP'
root:x:0:
baton:x:10001:
nogroup:x:65534:
GROUP
printf 'passwd: files\ngroup: files\nhosts: files dns\n' >"$root/etc/nsswitch.conf"

# State (decisions, the object-store cache) owned by baton; the repository's
# mount point; a /tmp anyone may write.
mkdir -p "$root/var/lib/baton" "$root/models" "$root/tmp" "$root/root"
# Group 0 may write too: a platform that runs images under an arbitrary
# uid in group 0 (OpenShift) can keep state there.
chown 10001:0 "$root/var/lib/baton"
chmod 0770 "$root/var/lib/baton"
chmod 0755 "$root/models"
chmod 1777 "$root/tmp"
chmod 0700 "$root/root"

# The build machine's resolver and name: the runtime provides its own (and
# /dev: scripts/image.sh removes mmdebstrap's device nodes from the tar).
rm -f "$root/etc/resolv.conf" "$root/etc/hostname"

# Not needed by baton.
rm -rf "$root/usr/share/doc" "$root/usr/share/man" "$root/usr/share/info" "$root/usr/share/lintian" \
    "$root/usr/share/locale" "$root/usr/share/gdb" "$root/usr/share/bash-completion" \
    "$root/usr/lib/x86_64-linux-gnu/gconv" "$root/usr/lib/aarch64-linux-gnu/gconv" \
    "$root/usr/bin/openssl" "$root/usr/bin/c_rehash" "$root/usr/lib/ssl/misc"
for dir in "$root/usr/lib/x86_64-linux-gnu" "$root/usr/lib/aarch64-linux-gnu"; do
    [ -d "$dir" ] || continue
    rm -rf "$dir/engines-3" "$dir/ossl-modules" "$dir/libssl.so.3" "$dir/libcrypto.so.3"
done
# debconf's and dpkg's tools (Perl scripts, with no Perl to run them), and
# the package lists and apt's state: no package manager runs in the image.
rm -rf "$root/usr/share/perl5" "$root/usr/share/debconf" "$root/usr/bin"/debconf* "$root/usr/sbin"/dpkg-* \
    "$root/usr/sbin/update-ca-certificates" "$root/etc/ca-certificates/update.d"
# dpkg's status file, as `dpkg --install` would have left it: each
# package's control fields (from the .deb files mmdebstrap downloaded into
# the root), marked installed. Image scanners (Trivy, Grype, Clair) read it
# to match the image's packages against Debian's security advisories.
# Written once the files baton never uses are removed: a package none of
# whose files is left (libssl3) is not listed, or scanners would report
# its advisories for an image that does not hold it.
archives="$root/var/cache/apt/archives"
# Whether any file of the package (a directory is not one) is still in the
# root, or it has none at all.
kept() {
    files=$(dpkg-deb --fsys-tarfile "$1" | tar -t | grep -v '/$' || true)
    [ -n "$files" ] || return 0
    printf '%s\n' "$files" | while IFS= read -r file; do
        if [ -e "$root/$file" ] || [ -L "$root/$file" ]; then
            echo kept
            break
        fi
    done | grep -q kept
}
mkdir -p "$root/var/lib/dpkg"
status="$root/var/lib/dpkg/status"
: >"$status"
found=0
for deb in "$archives"/*.deb; do
    [ -f "$deb" ] || continue
    found=$((found + 1))
    kept "$deb" || continue
    dpkg-deb --field "$deb" | awk '{ print } /^Package:/ { print "Status: install ok installed" }' >>"$status"
    echo >>"$status"
done
[ "$found" -gt 0 ] || { echo "rootfs-hook: no packages in $archives to record in dpkg's status" >&2; exit 1; }

# apt's configuration and state: sources.list names the build's mirror,
# credentials included when its URL has them.
rm -rf "$root/etc/apt" "$root/var/lib/apt" "$root/var/cache/apt" "$root/var/log/apt" "$root/var/cache/debconf"
