#!/usr/bin/env bash
# Installs NVIDIA Triton Inference Server 2.51 as a benchmark peer, from PyPI
# only, into .baton/bench-venv-triton (the sidecar agent's tests run against
# it too: scripts/test.sh runs this script):
#
#   nvidia-pytriton  its wheel ships the tritonserver binary, the python
#                    backend (backends/python/libtriton_python.so) and python
#                    backend stubs per Python version
#                    (python_backend_stubs/X.Y/triton_python_backend_stub)
#   onnxruntime      run by the model (bench/run-triton.sh's model.py) inside
#                    the stub processes
#   numpy 1.x        the stub is built against numpy 1.x (and nvidia-pytriton
#                    requires numpy<2); onnxruntime 1.32.0 works with it
#
# Then wires the stub: copies python_backend_stubs/X.Y (X.Y = the venv's
# Python) to backends/python/triton_python_backend_stub, where the python
# backend looks for it, and links .baton/bench-venv-triton/tritonserver to the
# wheel's tritonserver directory (bench/run-triton.sh uses that path).
#
# How the stub finds this venv's packages: the stub embeds CPython through
# libpython3.X.so.1.0 in an *isolated* configuration (PYTHONPATH and
# PYTHONHOME are ignored), so its sys.path comes from CPython's own search:
# it looks for `python3` on PATH, and a `pyvenv.cfg` beside it makes that
# venv's site-packages the path. bench/run-triton.sh therefore puts
# .baton/bench-venv-triton/bin first on PATH (as pytriton itself does), and
# LD_LIBRARY_PATH at the venv's base Python's LIBDIR, so the stub loads the
# libpython of the Python the venv was made with (the stub's RPATH covers
# only the wheel's own libraries; tritonserver's RPATH wins over
# LD_LIBRARY_PATH). The venv is made with /usr/bin/python3.11 when present
# (Debian's, whose libpython3.11.so.1.0 is what the stub finds by default);
# PYTHON=... picks another Python 3.8-3.13 with a shared libpython.
#
# Pinned below; every other package is held to bench/requirements/triton.lock
# (pip freeze of a working install) through pip's constraints;
# BENCH_UNLOCKED=1 drops the lock file. Idempotent: a stamp in the venv
# records what was installed; if it matches, only the stub wiring is checked.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PYTRITON_VERSION=0.7.0       # tritonserver 2.51.0
ONNXRUNTIME_VERSION=1.32.0
NUMPY_VERSION=1.26.4         # the last numpy 1.x

if [ -n "${PYTHON:-}" ]; then
  PY="$PYTHON"
elif [ -x /usr/bin/python3.11 ]; then
  PY=/usr/bin/python3.11
else
  PY=python3
fi

venv=.baton/bench-venv-triton
lock=bench/requirements/triton.lock
pkgs="nvidia-pytriton==$PYTRITON_VERSION onnxruntime==$ONNXRUNTIME_VERSION numpy==$NUMPY_VERSION"
constraints=()
if [ -z "${BENCH_UNLOCKED:-}" ] && [ -f "$lock" ]; then
  constraints=(-c "$lock")
fi
want="$(printf '%s|%s|%s|%s' "$pkgs" "$PY" "${constraints[*]:-}" "$( [ ${#constraints[@]} -gt 0 ] && sha256sum "$lock" | cut -c1-16)")"
stamp="$venv/.bench-stamp"
if ! [ -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "setup-triton: installing into $venv ($PY) ..." >&2
  [ -x "$venv/bin/python" ] || "$PY" -m venv "$venv"
  # shellcheck disable=SC2086
  "$venv/bin/pip" install --quiet --disable-pip-version-check "${constraints[@]}" $pkgs
  printf '%s' "$want" >"$stamp"
fi

# Wire the stub for the venv's Python version.
pyver="$("$venv/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
dist="$site/pytriton/tritonserver"
stub_src="$dist/python_backend_stubs/$pyver/triton_python_backend_stub"
stub="$dist/backends/python/triton_python_backend_stub"
[ -f "$stub_src" ] || { echo "setup-triton: no python backend stub for Python $pyver in $dist" >&2; exit 1; }
if ! cmp -s "$stub_src" "$stub"; then
  cp "$stub_src" "$stub.tmp" && chmod 755 "$stub.tmp" && mv "$stub.tmp" "$stub"
fi
ln -sfn "$(realpath --relative-to="$venv" "$dist")" "$venv/tritonserver"

# Check the shared libraries resolve as bench/run-triton.sh runs them.
libdir="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_config_var("LIBDIR") or "")')"
for bin in "$dist/bin/tritonserver" "$dist/backends/python/libtriton_python.so" "$stub"; do
  if LD_LIBRARY_PATH="$libdir" ldd "$bin" | grep -q 'not found'; then
    echo "setup-triton: unresolved libraries of $bin:" >&2
    LD_LIBRARY_PATH="$libdir" ldd "$bin" | grep 'not found' >&2
    exit 1
  fi
done
libpython="$(LD_LIBRARY_PATH="$libdir" ldd "$stub" | awk '/libpython/ {print $3}')"

"$venv/bin/python" - "$libpython" <<'PY'
import platform
import sys
from importlib.metadata import version
print(f"Triton ready (.baton/bench-venv-triton), Python {platform.python_version()}:")
print("  " + "  ".join(f"{n} {version(n)}" for n in ("nvidia-pytriton", "onnxruntime", "numpy")))
print(f"  stub: backends/python/triton_python_backend_stub (Python {sys.version_info[0]}.{sys.version_info[1]}), libpython {sys.argv[1]}")
PY
