#!/usr/bin/env bash
# Install the Debian packages ASO needs (deploy/debian-packages.txt) and Node.js when it is absent.
# Idempotent: a package that is already installed is not touched, so a second run is quick.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

want=$(grep -vE '^\s*(#|$)' "$here/debian-packages.txt")
# Node.js >= 18 runs pouchdb-server; keep the machine's own Node.js (e.g. nodesource) if it has one.
if ! command -v node >/dev/null 2>&1 || [ "$(node -p 'process.versions.node.split(".")[0]')" -lt 18 ]; then
  want="$want nodejs npm"
fi

missing=()
for pkg in $want; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || missing+=("$pkg")
done
[ ${#missing[@]} -eq 0 ] && { echo "system packages: all present"; exit 0; }

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "system packages: installing ${missing[*]}"
$sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq
$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
