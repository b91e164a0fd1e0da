#!/usr/bin/env bash
# Installs the Debian packages baton's tests need beyond Rust and Python.
# Building baton needs none: its gRPC definitions (KServe's and etcd's) are
# compiled with pure-Rust tools, so no protoc is involved.
# - libb64 for perf_analyzer (scripts/compat.sh);
# - prometheus for promtool, which checks and unit-tests the alert rules in
#   deploy/prometheus (the `alerts` test), and for the prometheus server the
#   metric-guard and dashboard tests start;
# - etcd-server (etcd 3.4) and etcd-client (etcdctl): cluster-mode tests
#   start their own etcd (baton-testkit's `etcd` module);
# - chromium: the console's tests drive a headless Chromium over the
#   DevTools protocol (crates/baton-server/tests/console.rs);
# - podman, runc and mmdebstrap: the container, Kubernetes and systemd tests
#   build images from Debian packages (no base image is pulled) and run them
#   (podman's default OCI runtime here is runc; crun refuses this machine's
#   hybrid cgroup layout); binutils (strip, objdump) and Debian's archive
#   keys, which scripts/image.sh needs besides;
# - dpkg-dev for dpkg-shlibdeps, which scripts/package-deb.sh computes the
#   Debian package's dependencies with (the systemd tests build and install
#   that package).
# Idempotent: installs only what is missing.
set -euo pipefail

packages=()
ldconfig -p | grep -q 'libb64\.so\.0d' || packages+=(libb64-0d)
{ command -v promtool && command -v prometheus; } >/dev/null || packages+=(prometheus)
[ -x /usr/bin/etcd ] || packages+=(etcd-server)
command -v etcdctl >/dev/null || packages+=(etcd-client)
[ -x /usr/bin/chromium ] || packages+=(chromium)
command -v podman >/dev/null || packages+=(podman)
command -v runc >/dev/null || packages+=(runc)
command -v mmdebstrap >/dev/null || packages+=(mmdebstrap)
command -v objdump >/dev/null || packages+=(binutils)
[ -s /usr/share/keyrings/debian-archive-keyring.gpg ] || packages+=(debian-archive-keyring)
command -v dpkg-shlibdeps >/dev/null || packages+=(dpkg-dev)
[ ${#packages[@]} -eq 0 ] && exit 0

if ! apt-get install -y -q --no-install-recommends "${packages[@]}" >/dev/null 2>&1; then
  apt-get update -q >/dev/null
  apt-get install -y -q --no-install-recommends "${packages[@]}" >/dev/null
fi

# Only the programs are wanted: where systemd runs, the prometheus and
# etcd-server packages also start a server; stop it and keep it from starting
# at boot (tests start their own). Each entry is package:service.
for entry in prometheus:prometheus etcd-server:etcd; do
  if [[ " ${packages[*]} " == *" ${entry%%:*} "* ]] && [ -d /run/systemd/system ]; then
    systemctl disable --now "${entry#*:}.service" >/dev/null 2>&1 || true
  fi
done
echo "Packages installed: ${packages[*]}"
