#!/usr/bin/env bash
# Build the project's virtual environment at .venv/ from Debian's CPython 3.11 and install ASO
# (editable) with its extras, pinned by deploy/python-constraints.txt.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
venv="$top/.venv"

python=${ASO_PYTHON:-/usr/bin/python3}
version=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
if [ "$version" != "3.11" ]; then
  echo "install-python: $python is Python $version; ASO needs 3.11 (set ASO_PYTHON)" >&2
  exit 1
fi
if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv"
fi
# gfal2's Python module comes from Debian (python3-gfal2, built for CPython 3.11): expose that
# one module in the venv, not the whole of Debian's dist-packages.
gfal2_so=$(ls /usr/lib/python3/dist-packages/gfal2.cpython-311-*.so 2>/dev/null | head -1 || true)
if [ -n "$gfal2_so" ]; then
  ln -sf "$gfal2_so" "$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/"
fi
"$venv/bin/pip" install --quiet --disable-pip-version-check \
  -c "$top/deploy/python-constraints.txt" -e "$top[test,sim]"
