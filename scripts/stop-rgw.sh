#!/usr/bin/env bash
# Stops the cluster started by scripts/start-rgw.sh and removes its directory.
#
# Usage: scripts/stop-rgw.sh [DIR] [--keep]
#   DIR defaults to $DS_RGW_DIR (set by sourcing the env file).
#   --keep leaves the directory (logs) in place.
#
# Kills only the PIDs recorded in DIR/{rgw,osd,mon}.pid, and only when the
# process still runs the expected program (a PID may have been reused).
set -u
D=${1:-${DS_RGW_DIR:-}}
[ -n "$D" ] || { echo "usage: stop-rgw.sh DIR [--keep]" >&2; exit 2; }
[ -f "$D/ceph.conf" ] || { echo "stop-rgw: $D is not a directory made by start-rgw.sh" >&2; exit 2; }

for pair in rgw:radosgw osd:ceph-osd mon:ceph-mon; do
  n=${pair%%:*}
  prog=${pair#*:}
  f=$D/$n.pid
  [ -f "$f" ] || continue
  p=$(cat "$f")
  if [ -n "$p" ] && [ "$(cat "/proc/$p/comm" 2>/dev/null)" = "$prog" ]; then
    kill -TERM "$p" 2>/dev/null
    for _ in $(seq 1 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$p" 2>/dev/null && kill -KILL "$p" 2>/dev/null
  fi
  rm -f "$f"
done
[ "${2:-}" = "--keep" ] || rm -rf "$D"
exit 0
