#!/usr/bin/env bash
# Starts a throwaway S3 server for tests and benchmarks: a single-node Ceph
# cluster (one monitor, one memstore OSD, no manager) plus radosgw on
# 127.0.0.1, with one S3 user whose keys are random for this run.
#
# Needs (Debian 12, installed by scripts/install-deps.sh --test):
#   ceph-mon ceph-osd radosgw ceph-common
#
# Usage:  ENV_FILE=$(scripts/start-rgw.sh [DIR]) && source "$ENV_FILE"
#         ... run tests ...
#         scripts/stop-rgw.sh "$DS_RGW_DIR"
#
# Prints only the path of the env file on stdout (progress goes to stderr).
# The env file exports AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID,
# AWS_SECRET_ACCESS_KEY, AWS_REGION, DS_RGW_DIR and CEPH_CONF.
#
# Knobs (environment):
#   MEMSTORE_BYTES  memstore capacity, default 4 GiB. Memstore keeps every
#                   stored byte in RAM, so size test data accordingly.
#   RGW_START_TIMEOUT  seconds to wait for each daemon, default 60.
#   RGW_START_TRIES    starts of a radosgw that exits while starting, each
#                      on a newly drawn port, default 3.
#
# Ports: the monitor, the OSD's messengers and radosgw each get ports found
# free on 127.0.0.1 at start (no fixed ports, so parallel CI jobs and a
# developer's own cluster do not collide). Nothing listens beyond loopback.
set -euo pipefail

MEMSTORE_BYTES=${MEMSTORE_BYTES:-4294967296}
TIMEOUT=${RGW_START_TIMEOUT:-60}
T0=$(date +%s.%N)
# Progress and errors go to fd 3, the caller's stderr, so that a die() inside a
# check that wait_for() runs with its output discarded is still seen. The
# daemons must not inherit it (3>&-): a caller that reads this script's
# stderr through a pipe (Python's subprocess.run(capture_output=True),
# `$(start-rgw.sh 2>&1)`) would wait for the pipe's end as long as they run.
exec 3>&2

log() { awk -v t0="$T0" -v now="$(date +%s.%N)" -v m="$*" 'BEGIN{printf "start-rgw: [%5.2fs] %s\n", now-t0, m}' >&3; }

for tool in ceph-mon ceph-osd radosgw radosgw-admin monmaptool ceph curl; do
  command -v "$tool" >/dev/null || { echo "start-rgw: $tool not found; install: apt-get install -y --no-install-recommends ceph-mon ceph-osd radosgw ceph-common curl" >&2; exit 1; }
done

if [ $# -ge 1 ]; then
  D=$1
  mkdir -p "$D"
else
  D=$(mktemp -d "${TMPDIR:-/tmp}/deltasync-rgw.XXXXXX")
fi
D=$(realpath "$D")
[ -z "$(ls -A "$D")" ] || { echo "start-rgw: $D is not empty" >&2; exit 1; }
mkdir -p "$D"/{run,log,mon,osd/ceph-0,rgw,crash}
CONF=$D/ceph.conf
export CEPH_CONF=$CONF

# Kills only what this script started (by the PIDs it recorded), shows the
# daemons' log tails, and exits non-zero.
die() {
  log "ERROR: $*"
  for f in "$D"/log/*.log "$D"/log/*.out "$D"/log/*.err; do
    [ -s "$f" ] && { echo "== $f (last 20 lines)" >&3; tail -n 20 "$f" >&3; }
  done
  for n in rgw osd mon; do
    [ -f "$D/$n.pid" ] && kill -9 "$(cat "$D/$n.pid")" 2>/dev/null
  done
  exit 1
}

# --- ports -----------------------------------------------------------------
# A port is free when nothing in /proc/net/tcp{,6} uses it locally. Random
# candidates keep two concurrent starts from racing for the same port. They
# are drawn below the kernel's ephemeral range where it leaves room (the
# daemons' own connections, the ceph CLI's and curl's take their local ports
# from that range, and one of them could hold a port between the check and
# the daemon's bind).
used_ports() {
  local _sl addr _rest
  cat /proc/net/tcp /proc/net/tcp6 2>/dev/null | while read -r _sl addr _rest; do
    case "$addr" in *:*) echo $((16#${addr##*:})) ;; esac
  done | sort -u
}
USED=" $(used_ports | tr '\n' ' ') "
port_free() { case "$USED" in *" $1 "*) return 1 ;; esac; return 0; }
read -r EPH_LO EPH_HI </proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || EPH_LO=0
if [ "${EPH_LO:-0}" -ge 12000 ]; then
  PORT_LO=10000 PORT_SPAN=$((EPH_LO - 10000))
else
  PORT_LO=20000 PORT_SPAN=40000
fi
# Sets FOUND to the first of N consecutive free ports, trying random bases,
# and marks them used (so it runs in this shell, never in a $(...) subshell,
# where the marks would be lost and two daemons could draw the same port).
find_free_range() {
  local n=$1 base p ok
  for _ in $(seq 1 200); do
    base=$((PORT_LO + (RANDOM * 32768 + RANDOM) % (PORT_SPAN - n)))
    ok=1
    for p in $(seq "$base" $((base + n - 1))); do port_free "$p" || { ok=0; break; }; done
    if [ $ok = 1 ]; then
      USED="$USED$(seq -s ' ' "$base" $((base + n - 1))) "
      FOUND=$base
      return 0
    fi
  done
  return 1
}
find_free_range 1 || die "no free port for the monitor"
MON_PORT=$FOUND
find_free_range 1 || die "no free port for radosgw"
RGW_PORT=$FOUND
find_free_range 16 || die "no free port range for the OSD"
OSD_PORT_MIN=$FOUND
OSD_PORT_MAX=$((OSD_PORT_MIN + 15))

# Random keys for this run: nothing else can use the cluster, and a test can
# check that the secret never shows up in a message.
rand() { tr -dc "$1" </dev/urandom | head -c "$2" || true; }
ACCESS_KEY=DS$(rand 'A-Z0-9' 18)
SECRET_KEY=$(rand 'A-Za-z0-9' 40)
FSID=$(cat /proc/sys/kernel/random/uuid)
OSD_UUID=$(cat /proc/sys/kernel/random/uuid)

cat >"$CONF" <<EOF
[global]
fsid = $FSID
mon host = v2:127.0.0.1:$MON_PORT
mon initial members = a
public addr = 127.0.0.1
cluster addr = 127.0.0.1
ms bind msgr1 = false
ms bind ipv6 = false
ms bind port min = $OSD_PORT_MIN
ms bind port max = $OSD_PORT_MAX
auth cluster required = none
auth service required = none
auth client required = none
auth supported = none
# radosgw defaults to ms_mon_client_mode=secure, which auth=none cannot do
# (symptom in the rgw log: 'get_initial_auth_request returned -13').
ms mon client mode = crc secure
run dir = $D/run
admin socket = $D/run/\$name.asok
pid file = $D/run/\$name.pid
log file = $D/log/\$name.log
log to stderr = false
err to stderr = true
crash dir = $D/crash
keyring = /dev/null
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
mon allow pool size one = true
mon allow pool delete = true
mon max pg per osd = 1000
mon warn on pool no redundancy = false
# No manager runs; without this health turns MGR_DOWN a while after mkfs.
mon mgr mkfs grace = 100000000
mon warn on insecure global id reclaim allowed = false
mon data avail warn = 2
mon data avail crit = 1
# Every osdmap change waits paxos_propose_interval (1 s by default) and
# radosgw's first start makes ~15 of them: 14 s to start instead of ~2 s.
paxos propose interval = 0.01
paxos min wait = 0.001

[mon]
mon data = $D/mon/\$cluster-\$id
mon cluster log file = $D/log/cluster.log

[osd]
osd data = $D/osd/\$cluster-\$id
osd objectstore = memstore
memstore device bytes = $MEMSTORE_BYTES
osd op num shards = 2
osd op num threads per shard = 1
osd crush update on start = true
osd max object name len = 460
osd max object namespace len = 64

[client.rgw.a]
# tcp_nodelay=1: without it every small GET on a kept-alive connection
# stalls ~40 ms (Nagle against the client's delayed ACK; measured: 47 ms a GET).
rgw frontends = beast endpoint=127.0.0.1:$RGW_PORT tcp_nodelay=1
rgw data = $D/rgw
rgw thread pool size = 64
# Virtual-hosted addressing: http://BUCKET.localhost:PORT/key
rgw dns name = localhost
rgw enable usage log = false
# Deleted and overwritten data is freed only by RGW garbage collection
# (default: after 2 h). With memstore that data is RAM: collect quickly.
rgw gc obj min wait = 5
rgw gc processor period = 10
EOF

wait_for() {  # wait_for WHAT COMMAND... : polls every 0.2 s up to TIMEOUT
  local what=$1; shift
  local tries=$((TIMEOUT * 5))
  for _ in $(seq 1 "$tries"); do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done
  die "$what not ready after ${TIMEOUT}s"
}

# --- monitor -----------------------------------------------------------------
monmaptool --create --fsid "$FSID" --addv a "[v2:127.0.0.1:$MON_PORT]" "$D/monmap" >"$D/log/monmap.out" 2>&1 \
  || die "monmaptool failed"
ceph-mon --mkfs -i a --monmap "$D/monmap" >"$D/log/mon.mkfs.out" 2>&1 || die "ceph-mon --mkfs failed"
nohup ceph-mon -f -i a >"$D/log/mon.a.out" 2>&1 </dev/null 3>&- &
echo $! >"$D/mon.pid"
wait_for "monitor" ceph --connect-timeout 2 mon stat
log "monitor up on 127.0.0.1:$MON_PORT"

# --- OSD ---------------------------------------------------------------------
OSD_ID=$(ceph osd new "$OSD_UUID" 2>"$D/log/osd.new.err") || die "ceph osd new failed"
[ "$OSD_ID" = 0 ] || die "unexpected osd id '$OSD_ID'"
ceph-osd -i 0 --mkfs --osd-uuid "$OSD_UUID" >"$D/log/osd.mkfs.out" 2>&1 || die "ceph-osd --mkfs failed"
nohup ceph-osd -f -i 0 >"$D/log/osd.0.out" 2>&1 </dev/null 3>&- &
echo $! >"$D/osd.pid"
osd_up() { ceph osd dump 2>/dev/null | grep -q '^osd.0 up *in'; }
wait_for "osd.0" osd_up
log "osd.0 up (memstore, $((MEMSTORE_BYTES >> 20)) MiB)"

# --- radosgw -----------------------------------------------------------------
# A radosgw that exits while starting (seen once in CI, its log then unseen)
# is shown with its log tail and started again on a newly drawn port, up to
# RGW_START_TRIES times (default 3).
TRIES=${RGW_START_TRIES:-3}
for try in $(seq 1 "$TRIES"); do
  nohup radosgw -f -n client.rgw.a >"$D/log/rgw.a.out" 2>&1 </dev/null 3>&- &
  echo $! >"$D/rgw.pid"
  started=0
  for _ in $(seq 1 $((TIMEOUT * 5))); do
    if ! kill -0 "$(cat "$D/rgw.pid")" 2>/dev/null; then
      started=exited
      break
    fi
    if curl -fs -o /dev/null --max-time 2 "http://127.0.0.1:$RGW_PORT/" >/dev/null 2>&1; then
      started=1
      break
    fi
    sleep 0.2
  done
  [ "$started" = 1 ] && break
  [ "$started" = 0 ] && die "radosgw not answering on 127.0.0.1:$RGW_PORT after ${TIMEOUT}s"
  [ "$try" -lt "$TRIES" ] || die "radosgw exited while starting, $TRIES times"
  log "radosgw exited while starting on port $RGW_PORT (try $try of $TRIES); its log:"
  for f in "$D/log/rgw.a.out" "$D/log/client.rgw.a.log"; do
    [ -s "$f" ] && { echo "== $f (last 20 lines)" >&3; tail -n 20 "$f" >&3; mv "$f" "$f.try$try"; }
  done
  find_free_range 1 || die "no free port for radosgw"
  RGW_PORT=$FOUND
  sed -i "s|^rgw frontends = beast endpoint=127\.0\.0\.1:[0-9]* |rgw frontends = beast endpoint=127.0.0.1:$RGW_PORT |" "$CONF"
  grep -q "^rgw frontends = beast endpoint=127.0.0.1:$RGW_PORT " "$CONF" || die "could not set the new radosgw port in $CONF"
done
log "radosgw answering on 127.0.0.1:$RGW_PORT"

radosgw-admin user create --uid=deltasync-test --display-name=deltasync-test \
  --access-key="$ACCESS_KEY" --secret-key="$SECRET_KEY" >"$D/log/user.json" 2>"$D/log/user.err" \
  || die "radosgw-admin user create failed"
rm -f "$D/log/user.json"  # it holds the secret; the env file (mode 600) is the one copy

umask 077
cat >"$D/env" <<EOF
# Written by scripts/start-rgw.sh; stop with: scripts/stop-rgw.sh $D
export AWS_ENDPOINT_URL=http://127.0.0.1:$RGW_PORT
export AWS_ACCESS_KEY_ID=$ACCESS_KEY
export AWS_SECRET_ACCESS_KEY=$SECRET_KEY
export AWS_REGION=us-east-1
export DS_RGW_DIR=$D
export CEPH_CONF=$CONF
EOF
log "ready: source $D/env; stop with scripts/stop-rgw.sh $D"
echo "$D/env"
