#!/usr/bin/env bash
# Restarts the radosgw of a cluster started by scripts/start-rgw.sh, with the
# same configuration and port (the soak test kills radosgw to test S3 outages;
# the monitor and the memstore OSD keep running, so the bucket is kept).
#
# Usage: scripts/restart-rgw.sh [DIR]     (DIR defaults to $DS_RGW_DIR)
#
# SIGKILLs the radosgw recorded in DIR/rgw.pid if it still runs (and only if
# that pid is a radosgw), starts a new one, records its pid and waits until it
# answers (RGW_START_TIMEOUT seconds, default 60). Exit 1 if it does not.
set -euo pipefail
D=${1:-${DS_RGW_DIR:-}}
[ -n "$D" ] || { echo "usage: restart-rgw.sh DIR" >&2; exit 2; }
[ -f "$D/ceph.conf" ] || { echo "restart-rgw: $D is not a directory made by start-rgw.sh" >&2; exit 2; }
TIMEOUT=${RGW_START_TIMEOUT:-60}
export CEPH_CONF=$D/ceph.conf
PORT=$(sed -n 's/^rgw frontends = beast endpoint=127\.0\.0\.1:\([0-9]*\)\( .*\)\{0,1\}$/\1/p' "$CEPH_CONF")
[ -n "$PORT" ] || { echo "restart-rgw: no radosgw port in $CEPH_CONF" >&2; exit 1; }

if [ -f "$D/rgw.pid" ]; then
  p=$(cat "$D/rgw.pid")
  if [ -n "$p" ] && [ "$(cat "/proc/$p/comm" 2>/dev/null)" = radosgw ]; then
    kill -KILL "$p" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.05; done
  fi
fi
# A radosgw that exits while starting is shown with its log tail and started
# again (the clients know this port, so the same one), up to RGW_START_TRIES
# times (default 3).
TRIES=${RGW_START_TRIES:-3}
for try in $(seq 1 "$TRIES"); do
  nohup radosgw -f -n client.rgw.a >>"$D/log/rgw.a.out" 2>&1 </dev/null &
  echo $! >"$D/rgw.pid"
  for _ in $(seq 1 $((TIMEOUT * 10))); do
    kill -0 "$(cat "$D/rgw.pid")" 2>/dev/null || break
    curl -fs -o /dev/null --max-time 2 "http://127.0.0.1:$PORT/" && exit 0
    sleep 0.1
  done
  if kill -0 "$(cat "$D/rgw.pid")" 2>/dev/null; then
    echo "restart-rgw: radosgw not answering on 127.0.0.1:$PORT after ${TIMEOUT}s" >&2
    exit 1
  fi
  echo "restart-rgw: radosgw exited while starting (try $try of $TRIES); see $D/log/" >&2
  tail -n 20 "$D/log/rgw.a.out" >&2
  sleep 0.5
done
exit 1
