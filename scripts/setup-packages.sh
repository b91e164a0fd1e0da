#!/usr/bin/env bash
# Installs the Debian packages baton's tests need: libb64 for perf_analyzer
# (scripts/compat.sh), and prometheus for promtool, which checks and
# unit-tests the alert rules in deploy/prometheus (the `alerts` test).
# Idempotent: installs only what is missing.
set -euo pipefail

packages=()
ldconfig -p | grep -q 'libb64\.so\.0d' || packages+=(libb64-0d)
command -v promtool >/dev/null || packages+=(prometheus)
[ ${#packages[@]} -eq 0 ] && exit 0

if ! apt-get install -y -q --no-install-recommends "${packages[@]}" >/dev/null 2>&1; then
  apt-get update -q >/dev/null
  apt-get install -y -q --no-install-recommends "${packages[@]}" >/dev/null
fi

# Only promtool is wanted: where systemd runs, the package also starts a
# Prometheus server; stop it and keep it from starting at boot.
if [[ " ${packages[*]} " == *" prometheus "* ]] && [ -d /run/systemd/system ]; then
  systemctl disable --now prometheus.service >/dev/null 2>&1 || true
fi
echo "Packages installed: ${packages[*]}"
