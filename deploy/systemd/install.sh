#!/usr/bin/env bash
# Render ASO's systemd units for an installation prefix and install them.
#
#   deploy/systemd/install.sh [--prefix P] [--dest DIR]
#
# --prefix P  where ASO is installed: a checkout set up with `make setup`, so that P/.venv/bin/aso
#             runs it (default /opt/aso). Absolute, without spaces or '%'.
# --dest DIR  only write the rendered units into DIR (packaging, tests) and stop there.
#
# Without --dest (as root): the units go to /etc/systemd/system, the system user aso is created
# (sysusers.d), /etc/aso is made (the config is /etc/aso/aso.toml), and systemd is reloaded.
# Nothing is enabled or started: which units run on a host is the operator's choice.
#
# Units: aso-AGENT@.service for every agent (instances are slots: aso-submitter@0.service),
# aso-frontend.service, aso-store.service (the embedded store) and aso.target.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

# The agents of agents/__init__.py AGENTS (tests/test_deploy.py keeps the two lists equal).
AGENTS="submitter monitor gfal-worker retry-manager cleaner publisher reconciler analytics hold-checker notifier"

usage() { sed -n '4,9p' "$0" | sed 's/^# \{0,1\}//'; }

prefix=/opt/aso
dest=""
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) prefix=${2:?--prefix needs a directory}; shift 2 ;;
    --prefix=*) prefix=${1#*=}; shift ;;
    --dest) dest=${2:?--dest needs a directory}; shift 2 ;;
    --dest=*) dest=${1#*=}; shift ;;
    -h | --help) usage; exit 0 ;;
    *) echo "install.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done

# systemd wants absolute paths; a space would split ExecStart, a '%' would be a specifier.
case "$prefix" in
  /*) ;;
  *) echo "install.sh: --prefix must be an absolute path, not '$prefix'" >&2; exit 2 ;;
esac
case "$prefix" in
  *[[:space:]%]*) echo "install.sh: --prefix must not hold spaces or '%': '$prefix'" >&2; exit 2 ;;
esac
prefix=${prefix%/}
aso="$prefix/.venv/bin/aso"

# render SOURCE TARGET [AGENT]: the source with its @PLACEHOLDERS@ filled in.
render() {
  local escaped_prefix escaped_aso
  escaped_prefix=$(printf '%s' "$prefix" | sed 's/[\\&|]/\\&/g')
  escaped_aso=$(printf '%s' "$aso" | sed 's/[\\&|]/\\&/g')
  sed -e "s|@PREFIX@|$escaped_prefix|g" -e "s|@ASO@|$escaped_aso|g" -e "s|@AGENT@|${3:-}|g" \
    "$1" >"$2"
  if grep -q '@[A-Z]*@' "$2"; then
    echo "install.sh: $2 still has a placeholder: $(grep -o '@[A-Z]*@' "$2" | head -1)" >&2
    exit 1
  fi
}

render_all() {
  local out=$1 agent
  mkdir -p "$out"
  for agent in $AGENTS; do
    render "$here/aso-agent@.service.in" "$out/aso-$agent@.service" "$agent"
  done
  render "$here/aso-frontend.service.in" "$out/aso-frontend.service"
  render "$here/aso-store.service.in" "$out/aso-store.service"
  cp "$here/aso.target" "$out/aso.target"
}

if [ ! -x "$aso" ]; then
  [ -z "$dest" ] && { echo "install.sh: $aso not found: run 'make setup' in $prefix first" >&2; exit 1; }
  echo "install.sh: warning: $aso not found (the units start it)" >&2
fi

if [ -n "$dest" ]; then
  render_all "$dest"
  echo "rendered the units for prefix $prefix into $dest"
  exit 0
fi

[ "$(id -u)" -eq 0 ] || { echo "install.sh: run as root (or give --dest DIR)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
render_all "$work"
install -m 0644 "$work"/* /etc/systemd/system/
install -D -m 0644 "$here/aso.sysusers" /etc/sysusers.d/aso.conf
systemd-sysusers /etc/sysusers.d/aso.conf
# The config holds the store passwords: readable by root and group aso only.
install -d -m 0750 -o root -g aso /etc/aso
systemctl daemon-reload
echo "installed the ASO units for prefix $prefix into /etc/systemd/system:"
(cd "$work" && ls)
echo "next: write /etc/aso/aso.toml (mode 0640, group aso), then enable units, e.g."
echo "  systemctl enable --now aso-submitter@0.service aso-monitor@0.service ..."
