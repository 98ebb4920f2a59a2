#!/usr/bin/env python3
"""deltasync's fault-injection soak (issue 10).

A publisher (the stateless `deltasync publish`, or a `deltasync.Publisher`
process) writes versions of a deterministic synthetic trainer into a bucket
while replicas follow it: `serve` daemons (`--out` folder + `--shm`, `--out`
file layout), repeated `pull`s, and a `deltasync.Replica` process. Meanwhile
the harness SIGKILLs each of them at random moments, damages recent objects
(byte flip, truncation, deletion: a damaged copy renamed over the object),
runs `gc` concurrently and, on S3, SIGKILLs and restarts radosgw. Damage is
of two kinds: below the newest anchor (replicas behind route around it), and
between the newest anchor and the newest version followed by a publisher kill
(the restarted publisher must commit a recovered, anchor-only version;
`--no-publisher-damage` leaves this out). It checks:

- every version a replica reports holds exactly the trainer's bytes (sha256 of
  the tensors, computed by the harness from its own regeneration);
- after every publisher kill, the manifest names no missing or wrong object
  (`verify --all`) other than those the harness damaged, and its newest
  version holds the trainer's bytes; a publisher never fails while the store
  is up;
- every replica reaches the final version by itself (no repair);
- after every writer stops and an age-0 `gc`, no temporary file is left in the
  bucket or the `--out` folders.

It prints one summary line and exits 1 on any violation. Usage:

  .venv/bin/python tests/soak/soak.py --duration 180 --seed 1 [--bucket DIR|s3://b/prefix]
"""
import argparse
import http.client
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
ROOT = os.path.dirname(os.path.dirname(HERE))

from bucket import open_bucket, temporaries_under  # noqa: E402
from model import Trainer, read_safetensors_hash, state_hash, write_safetensors  # noqa: E402
from replicas import read_out_dir, read_shm  # noqa: E402


class Child:
    """A child process; its stdout lines are collected by a thread."""

    def __init__(self, kind, argv, log, kill_after=None, **extra):
        self.kind, self.argv, self.killed, self.proc_stderr = kind, argv, False, log
        self.__dict__.update(extra)
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        self.lines, self._taken = [], 0
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        self.timer = None
        if kill_after is not None:
            self.arm_kill(kill_after)

    def arm_kill(self, delay):
        """SIGKILL after delay seconds, at whatever moment of its work that is."""
        self.timer = threading.Timer(delay, self._sigkill)
        self.timer.daemon = True
        self.timer.start()

    def kill_armed(self):
        return self.timer is not None and self.timer.is_alive()

    def _sigkill(self):
        if self.proc.poll() is None:
            self.killed = True
            self.proc.kill()

    def cancel_kill(self):
        if self.timer is not None:
            self.timer.cancel()
            self.timer.join()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line.decode(errors="replace").rstrip("\n"))

    def new_lines(self):
        n = len(self.lines)
        out, self._taken = self.lines[self._taken:n], n
        return out

    def new_messages(self):
        """The new stdout lines that are JSON objects (the Python roles' reports)."""
        out = []
        for line in self.new_lines():
            try:
                out.append(json.loads(line))
            except ValueError:
                print(f"soak: {self.kind} printed a line that is not JSON: {line!r}", file=sys.stderr)
        return out

    def running(self):
        return self.proc.poll() is None

    def kill(self):
        self.cancel_kill()
        self._sigkill()
        self.proc.wait()
        self.reader.join(timeout=5)

    def stop(self, timeout=20):
        self.cancel_kill()
        if self.running():
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.reader.join(timeout=5)


class Soak:
    def __init__(self, args):
        self.a = args
        self.rng = random.Random(args.seed)
        self.work = os.path.abspath(args.workdir or tempfile.mkdtemp(prefix="deltasync-soak."))
        os.makedirs(self.work, exist_ok=True)
        self.scratch = os.path.join(self.work, "scratch")
        os.makedirs(self.scratch, exist_ok=True)
        self.log = open(os.path.join(self.work, "children.log"), "ab")
        self.bucket = open_bucket(args.bucket or os.path.join(self.work, "bucket"), self.scratch)
        self.bin = args.deltasync_bin
        self.py = sys.executable
        self.truth_trainer, self.ckpt_trainer = Trainer(args.seed), Trainer(args.seed)
        self.truth = {}  # version -> sha256 of the trainer's tensors
        self.kills = {k: 0 for k in ("publisher_cli", "publisher_py", "serve", "pull", "replica_py", "gc", "rgw")}
        self.damaged = {}  # key -> {"version", "how"}
        self.named = {}  # key -> set of replica ids that named it bad
        self.undamaged_named = set()  # (replica, key) named bad though not damaged: checked once
        self.routed = set()  # damaged keys a replica named and then went past
        self.recovered = set()  # versions a publisher committed anchor-only (past damage it could not rebuild)
        self.held = {}  # replica id -> highest version verified
        self.current = {}  # replica id -> the version it reported last
        self.checked = 0  # replica states compared with the ground truth
        self.divergent = 0
        self.violations = []
        self.notes = {"publish_failures_store_down": 0, "pulls": 0, "pull_failures": 0, "gc_runs": 0, "commit_checks": 0,
                      "removed_by_gc_meanwhile": 0, "daemon_start_failures": 0, "daemon_pauses": 0}
        self.publisher = None
        self.pulls = []
        self.gcs = []
        self.daemons = []
        self.replica = None
        self.rgw_down_until = None
        self.rgw_up_at = 0.0
        self.rgw_dir = os.environ.get("DS_RGW_DIR") if self.bucket.root is None else None
        self.commit_check_pending = False
        self.final = False
        self.dt = 0.0
        self._manifest = None
        self.last_publish_ok = time.monotonic()
        self.pull_seq = 0
        self.err_seq = 0
        self.pull_dir = os.path.join(self.work, "pulls")
        os.makedirs(self.pull_dir, exist_ok=True)

    # ---- ground truth and checks ------------------------------------------------
    def truth_of(self, version):
        if version not in self.truth:
            # versions are asked for in increasing order; fill every gap forward
            for v in range(max(self.truth, default=0) + 1, version + 1):
                self.truth[v] = state_hash(self.truth_trainer.state(v))
        return self.truth[version]

    def violation(self, what):
        self.violations.append(what)
        print(f"soak: VIOLATION: {what}", file=sys.stderr, flush=True)

    def saw(self, who, version, digest, bad=()):
        """A replica reports holding version with these bytes."""
        for b in bad:
            key = b["key"]
            self.named.setdefault(key, set()).add(who)
            if key not in self.damaged and (who, key) not in self.undamaged_named:
                # not damaged by the harness: fine only when gc removed it meanwhile (the manifest no longer
                # lists it); anything else is a publisher that committed a bad object, or a bug
                m = self.manifest(fresh=True)
                if m is None:
                    continue
                self.undamaged_named.add((who, key))
                if any(o["key"] == key for v in m["versions"] for o in v["objects"]):
                    self.violation(f"{who} found {key} (version {b.get('version')}) bad, but the harness did "
                                   f"not damage it and the manifest lists it")
                else:
                    self.notes["removed_by_gc_meanwhile"] += 1
        if not version:
            return
        self.checked += 1
        if digest != self.truth_of(version):
            self.divergent += 1
            self.violation(f"{who} holds version {version} with bytes that differ from the trainer's "
                           f"({digest} != {self.truth_of(version)})")
        self.went_past(who, version)

    def went_past(self, who, version):
        if not who.startswith("pull#"):  # each pull is its own replica, gone when it ends
            self.held[who] = max(self.held.get(who, 0), version)
            self.current[who] = version
        base = who.split("/")[0]  # a daemon names bad objects in /status and shows versions in --out/--shm
        for key, whos in self.named.items():
            if base in whos and key in self.damaged and self.damaged[key]["version"] <= version:
                self.routed.add(key)

    def named_in(self, who, message):
        """A failure message that names damaged objects (no route left) refuses them by name."""
        for key in self.damaged:
            if key in message:
                self.named.setdefault(key, set()).add(who)

    def manifest(self, fresh=False):
        """The bucket's manifest (None when unreadable); reads within 0.2 s share one unless fresh."""
        now = time.monotonic()
        if not fresh and self._manifest is not None and now - self._manifest[0] < 0.2:
            return self._manifest[1]
        try:
            m = self.bucket.manifest()
            self._manifest = (now, m)
            for v in (m or {}).get("versions", [])[-50:]:
                if v.get("recovered"):  # an anchor-only version: a publisher got past damage by itself
                    self.recovered.add(v["version"])
            return m
        except (IOError, OSError, ValueError) as e:
            if self.rgw_down_until is None:
                self.note(f"manifest read failed: {e}")
            return None

    def newest(self, manifest=None, fresh=False):
        m = manifest if manifest is not None else self.manifest(fresh)
        return m["versions"][-1]["version"] if m and m["versions"] else 0

    def note(self, text):
        if self.a.verbose:
            print(f"soak: {text}", file=sys.stderr, flush=True)

    # ---- processes ---------------------------------------------------------------
    def maybe_arm_kill(self, child):
        """Long-lived replicas die at a rate (--kill-rate / 10 per second), at a random moment of their work."""
        if not self.final and not child.kill_armed() and self.chance(self.a.kill_rate / 10):
            child.arm_kill(self.rng.uniform(0.0, 1.0))

    def chance(self, per_second):
        """True with the probability of an event of this rate in the last loop's time."""
        return self.rng.random() < per_second * min(self.dt, 5.0)

    def kill_after(self, p, window):
        """With chance p, a delay within window after which the child is SIGKILLed."""
        if self.final:
            return None
        return self.rng.uniform(0.005, window) if self.rng.random() < p else None

    def start_publisher(self, target):
        m = self.manifest(fresh=True)
        if m is None and self.rgw_down_until is not None:
            return
        newest = self.newest(m)
        if newest >= target:
            return
        self.truth_of(newest + 1)
        settings = ["--anchor-interval", str(self.a.anchor_interval), "--cumulative-every", str(self.a.cumulative_every)]
        if newest == 0 or self.rng.random() < 0.55:
            version = newest + 1
            ckpt = os.path.join(self.scratch, "ckpt.safetensors")
            write_safetensors(ckpt, self.ckpt_trainer.state(version), version)
            argv = [self.bin, "publish", self.bucket.url, ckpt, "--version", str(version), "--quiet", *settings]
            if newest == 0 and self.bucket.root is None:
                argv.append("--create-bucket")
            self.publisher = Child("publisher_cli", argv, self.err_file("publish"), self.kill_after(0.3, 0.12),
                                   version=version)
        else:
            upto = min(target, newest + self.rng.randint(3, 25))
            argv = [self.py, os.path.join(HERE, "soak.py"), "--role", "publisher", "--bucket", self.bucket.url,
                    "--seed", str(self.a.seed), "--upto", str(upto), "--pace", str(self.rng.choice([0, 0.02, 0.1])),
                    "--anchor-interval", str(self.a.anchor_interval), "--cumulative-every", str(self.a.cumulative_every)]
            if self.rng.random() < 0.3:
                argv.append("--background")
            # its start regenerates the trainer up to newest (~3 ms a version): kills land in that and in publishing
            self.publisher = Child("publisher_py", argv, self.err_file("publish"),
                                   self.kill_after(0.5, 1.0 + 0.003 * newest + 3.0), upto=upto)

    def reap_publisher(self):
        p = self.publisher
        if p is None:
            return
        if p.running():
            for msg in p.new_messages():
                if "published" in msg:
                    self.last_publish_ok = time.monotonic()
            return
        p.reader.join(timeout=5)
        stderr = self.take_err(p)
        error = None
        for msg in p.new_messages():
            if "published" in msg:
                self.last_publish_ok = time.monotonic()
            elif "error" in msg:
                error = msg["error"]
        self.publisher = None
        if p.killed:
            self.kills[p.kind] += 1
            self.commit_check_pending = True
        elif p.proc.returncode == 0:
            if p.kind == "publisher_cli":
                self.last_publish_ok = time.monotonic()
        else:
            error = error or (stderr.strip().splitlines() or ["(no message)"])[-1]
            if self.store_down():
                self.notes["publish_failures_store_down"] += 1
            else:
                # with the store up, a publisher given the complete weights always moves forward
                self.violation(f"{p.kind} failed (exit {p.proc.returncode}): {error}")

    def store_down(self):
        """radosgw is down, or came back less than 15 s ago (clients are still backing off)."""
        return self.rgw_dir is not None and (self.rgw_down_until is not None or time.monotonic() - self.rgw_up_at < 15)

    def err_file(self, name):
        self.err_seq += 1
        return open(os.path.join(self.scratch, f"{name}-{self.err_seq}.err"), "w+b")

    def take_err(self, child):
        """A child's stderr (its own file): appended to children.log, returned as text."""
        f = child.proc_stderr
        f.seek(0)
        data = f.read()
        f.close()
        os.unlink(f.name)
        self.log.write(data)
        return data.decode(errors="replace")

    def start_daemon(self, index):
        d = self.daemons[index]
        argv = [self.bin, "serve", self.bucket.url, "--listen", "127.0.0.1:0", "--poll", "0.3", "--threads", "1",
                "--out", d["out"], "--log-level", "warn"]
        if d["layout"] == "file":
            argv += ["--out-layout", "file"]
        if d["shm"]:
            argv += ["--shm", d["shm"]]
        d["resume_at"] = None  # a restarted daemon is not paused
        d["child"] = Child("serve", argv, self.log, self.kill_after(self.a.kill_rate / 4, 3.0))
        d["addr"] = None

    def observe_daemon(self, index):
        d = self.daemons[index]
        c = d["child"]
        if c.killed:
            c.kill()
            self.kills["serve"] += 1
            if self.rng.random() < 0.5:
                time.sleep(self.rng.uniform(0, 1.0))
            self.start_daemon(index)
            return
        if not c.running():
            if self.store_down():
                self.notes["daemon_start_failures"] += 1  # could not reach radosgw at start: exit 1, as documented
                self.start_daemon(index)
                return
            self.violation(f"serve daemon {index} exited by itself (exit {c.proc.returncode}); see {self.log.name}")
            self.start_daemon(index)
            return
        self.maybe_arm_kill(c)
        for line in c.new_lines():
            if line.startswith("listening on "):
                d["addr"] = line.split()[-1]
        if not d["addr"]:
            return
        try:
            with urllib.request.urlopen(f"http://{d['addr']}/status", timeout=5) as r:
                status = json.load(r)
        except (OSError, http.client.HTTPException, ValueError):
            return  # killed meanwhile (a cut answer), or busy
        who = f"serve{index}"
        self.saw(who, 0, None, status.get("bad_objects", []))
        if (status.get("last_error") or {}).get("message"):
            self.named_in(who, status["last_error"]["message"])
        now = time.monotonic()
        if d.get("resume_at") and (now >= d["resume_at"] or self.final):
            self.post(d, "/resume")
            d["resume_at"] = None
        elif not d.get("resume_at") and not self.final and self.chance(0.1):
            if self.post(d, "/pause"):
                d["resume_at"] = now + self.rng.uniform(1.0, 8.0)
                self.notes["daemon_pauses"] += 1
        d["status"] = status
        try:  # the bytes are hashed once per version shown
            got = read_out_dir(d["out"], d.get("out_seen"))
        except AssertionError as e:
            self.violation(str(e))
            got = None
        if got:
            self.saw(who + "/out", *got)
            d["out_seen"] = got[0]
        if d["shm"]:
            got = read_shm(d["shm"], d.get("shm_seen"))
            if got:
                self.saw(who + "/shm", *got)
                d["shm_seen"] = got[0]
        if status.get("version"):
            # the daemon claims a version only after exporting it: the export is at least there
            self.went_past(who, status["version"])

    @staticmethod
    def post(d, route):
        try:
            req = urllib.request.Request(f"http://{d['addr']}{route}", data=b"{}", method="POST",
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=5) as r:
                r.read()
                return True
        except (OSError, http.client.HTTPException):
            return False

    def start_replica(self):
        argv = [self.py, os.path.join(HERE, "soak.py"), "--role", "replica", "--bucket", self.bucket.url,
                "--pace", "0.2", "--seed", str(self.rng.randrange(1 << 30))]
        self.replica = Child("replica_py", argv, self.log, self.kill_after(self.a.kill_rate / 4, 3.0))

    def observe_replica(self):
        r = self.replica
        self.maybe_arm_kill(r)
        for msg in r.new_messages():
            if "version" in msg:
                self.saw("replica_py", msg["version"], msg["sha"], msg.get("bad", []))
            if msg.get("error"):
                self.named_in("replica_py", msg["error"])
        if r.killed:
            r.kill()
            self.kills["replica_py"] += 1
            self.start_replica()
        elif not r.running():
            self.violation(f"the Python replica exited by itself (exit {r.proc.returncode}); see {self.log.name}")
            self.start_replica()

    def start_pull(self, version=None, hf=None):
        """A pull to the same path each time (one file, one model folder): each pull removes what a
        SIGKILLed one left there."""
        self.pull_seq += 1
        hf = self.rng.random() < 0.3 if hf is None else hf
        out = os.path.join(self.pull_dir, "model" if hf else "model.safetensors")
        argv = [self.bin, "pull", self.bucket.url, "--json"] + (["--hf-dir", out, "--force"] if hf else ["-o", out])
        if version:
            argv += ["--version", str(version)]
        kill_after = None if self.final else self.kill_after(self.a.kill_rate / 2, 0.15)
        c = Child("pull", argv, self.err_file("pull"), kill_after, out=out, version=version, who=f"pull#{self.pull_seq}",
                  file=os.path.join(out, "model.safetensors") if hf else out, hf=hf)
        self.pulls.append(c)
        return c

    def reap_pulls(self):
        for c in list(self.pulls):
            if c.running():
                continue
            c.reader.join(timeout=5)
            self.pulls.remove(c)
            self.named_in(c.who, self.take_err(c))
            if c.killed:
                self.kills["pull"] += 1
                if os.path.exists(c.file):  # complete (this pull's or, for a folder, an earlier one's): right
                    self.check_pull_file(c, None)
                continue
            lines = c.new_lines()
            if c.proc.returncode != 0 or not lines:
                self.notes["pull_failures"] += 1
                if not c.hf and os.path.exists(c.out):  # (a folder stays: the last good pull's)
                    self.violation(f"a failed pull left {c.out}")
                continue
            self.notes["pulls"] += 1
            res = json.loads(lines[-1])
            self.saw(c.who, 0, None, res.get("bad_objects", []))
            self.check_pull_file(c, res["version"])
            c.result = res

    def check_pull_file(self, c, version):
        meta, digest = read_safetensors_hash(c.file)
        v = int(meta.get("model_version", 0))
        if version is not None and v != version:
            self.violation(f"pull said version {version} but wrote model_version {v}")
        if c.version and v != c.version and not (c.hf and c.killed):  # (a killed one's folder may be older)
            self.violation(f"pull --version {c.version} wrote model_version {v}")
        self.saw(c.who, v, digest)
        if not c.hf:
            os.unlink(c.out)

    def start_gc(self):
        argv = [self.bin, "gc", self.bucket.url, "--json", "--keep-anchors", str(self.a.keep_anchors)]
        if self.bucket.root is not None:
            argv += ["--temp-older-than", self.rng.choice(["0", "0", "1"])]
        self.gcs.append(Child("gc", argv, self.log, self.kill_after(0.2, 0.05)))

    def reap_gcs(self):
        for c in list(self.gcs):
            if c.running():
                continue
            self.gcs.remove(c)
            if c.killed:
                self.kills["gc"] += 1
            elif c.proc.returncode == 0:
                self.notes["gc_runs"] += 1

    # ---- faults ------------------------------------------------------------------
    def damage(self, publisher_side=False):
        m = self.manifest(fresh=True)
        if not m or not m["versions"]:
            return
        versions = m["versions"]
        newest = versions[-1]["version"]
        anchors = [v["version"] for v in versions if any(o["kind"] == "anchor" for o in v["objects"])]
        newest_anchor = anchors[-1] if anchors else 0
        candidates, prev = [], None
        for v in versions:
            prev, this_prev = v["version"], prev
            if v["version"] < newest - 3 * self.a.anchor_interval:
                continue
            for o in v["objects"]:
                if o["key"] in self.damaged:
                    continue
                cumulative = o["kind"] == "delta" and o["base_version"] != this_prev
                if publisher_side:
                    # between the newest anchor and the newest version: what a restarting publisher needs
                    ok = v["version"] > newest_anchor or (v["version"] == newest_anchor and o["kind"] == "anchor")
                else:
                    # never the newest anchor nor a step delta after it: a route to the newest version
                    # always stays, for replicas and for a restarting publisher
                    ok = v["version"] < newest_anchor or (v["version"] == newest_anchor and o["kind"] != "anchor") \
                        or cumulative
                if ok:
                    candidates.append((v["version"], o))
        if not candidates:
            return
        # mostly what a replica behind needs now: what lies after the version the slowest one holds,
        # else the objects just below the newest anchor
        behind = min([self.current.get(w, newest) for w in self.followers()] + [newest])
        wanted = [c for c in candidates if c[0] > behind]
        near = [c for c in candidates if c[0] >= newest_anchor - self.a.anchor_interval]
        pick = self.rng.random()
        pool = wanted if wanted and pick < 0.6 else near if near and pick < 0.85 else candidates
        version, o = self.rng.choice(pool)
        how = self.rng.choice(["flip", "truncate", "delete"])
        try:
            if how == "delete":
                self.bucket.delete(o["key"])
            else:
                data = self.bucket.get(o["key"])
                if data is None or not data:
                    return  # gc removed it meanwhile
                data = bytearray(data)
                if how == "flip":
                    i = self.rng.randrange(len(data))
                    data[i] ^= 1 << self.rng.randrange(8)
                else:
                    data = data[:self.rng.randrange(len(data))]
                self.bucket.replace(o["key"], bytes(data))
        except (IOError, OSError) as e:
            self.note(f"damaging {o['key']} failed: {e}")
            return
        self.damaged[o["key"]] = {"version": version, "how": how, "publisher_side": publisher_side}
        self.note(f"damaged {o['key']} (version {version}): {how}")
        if publisher_side and self.publisher is not None:
            self.publisher.kill()  # the restart must get past it

    def followers(self):
        return [f"serve{i}" for i in range(len(self.daemons))] + ["replica_py"]

    def kill_rgw(self):
        pid_file = os.path.join(self.rgw_dir, "rgw.pid")
        try:
            with open(pid_file) as f:
                pid = int(f.read().strip())
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() != "radosgw":
                    return
            os.kill(pid, signal.SIGKILL)
        except (OSError, ValueError):
            return
        self.kills["rgw"] += 1
        self.rgw_down_until = time.monotonic() + self.rng.uniform(1.0, 5.0)
        self.note("killed radosgw")

    def restart_rgw(self):
        r = subprocess.run([os.path.join(ROOT, "scripts", "restart-rgw.sh"), self.rgw_dir],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        if r.returncode != 0:
            self.violation(f"restart-rgw.sh failed: {r.stdout.decode()[-500:]}")
        self.rgw_down_until = None
        self.rgw_up_at = time.monotonic()
        self.note("restarted radosgw")

    def check_commits(self):
        """After a publisher kill: every object the manifest names is whole, or one the harness damaged."""
        if self.gcs or self.rgw_down_until is not None:
            return
        self.commit_check_pending = False
        r = subprocess.run([self.bin, "verify", self.bucket.url, "--all", "--json", "--threads", "1"],
                           capture_output=True, timeout=300)
        try:
            report = json.loads(r.stdout)
        except ValueError:
            self.commit_check_pending = True  # a store failure (radosgw killed meanwhile): again later
            return
        self.notes["commit_checks"] += 1
        for b in report["bad_objects"]:
            if b["key"] not in self.damaged:
                self.violation(f"after a publisher kill the manifest names a bad object the harness did not "
                               f"damage: {b['key']} (version {b['version']}): {b['reason']}")
        # and the newest version (the one the killed publisher may have committed) holds the trainer's bytes
        newest = max(report["targets"], default=0)
        out = os.path.join(self.scratch, "commit-check.safetensors")
        r = subprocess.run([self.bin, "pull", self.bucket.url, "-o", out, "--version", str(newest), "--quiet"],
                           stdout=subprocess.DEVNULL, stderr=self.log, timeout=300)
        if r.returncode == 0:
            meta, digest = read_safetensors_hash(out)
            os.unlink(out)
            self.saw("commit-check", int(meta["model_version"]), digest)

    # ---- the run -----------------------------------------------------------------
    def run(self):
        a = self.a
        t0 = time.monotonic()
        target = a.versions if a.versions else 1 << 40
        deadline = t0 + a.duration if a.duration else None
        out_root = os.path.join(self.work, "out")
        for i in range(a.daemons):
            shm = f"deltasync-soak-{os.getpid()}-{i}" if i == 0 else None
            self.daemons.append({"out": os.path.join(out_root, f"serve{i}"), "layout": "folder" if i % 2 == 0 else "file",
                                 "shm": shm})
            os.makedirs(self.daemons[-1]["out"], exist_ok=True)
        # the first version, so that every replica has a bucket to open
        self.start_publisher(1)
        self.publisher.cancel_kill()
        self.publisher.proc.wait()
        self.reap_publisher()
        if self.newest(fresh=True) != 1:
            raise SystemExit(f"soak: the first publish failed; see {self.log.name}")
        for i in range(a.daemons):
            self.start_daemon(i)
        self.start_replica()
        next_report = time.monotonic() + 10
        last = time.monotonic()
        # main phase: faults
        while True:
            now = time.monotonic()
            newest = self.newest()
            if newest >= target - 1 or (deadline and now >= deadline):
                break
            if self.rgw_down_until is not None and now >= self.rgw_down_until:
                self.restart_rgw()
            self.reap_publisher()
            if self.publisher is None and self.rgw_down_until is None:
                self.start_publisher(target - 1)
            if now - self.last_publish_ok > a.stall_seconds:
                self.violation(f"no version published for {a.stall_seconds} s (newest {newest}); see {self.log.name}")
                break
            self.reap_pulls()
            self.reap_gcs()
            for i in range(len(self.daemons)):
                self.observe_daemon(i)
            self.observe_replica()
            r = self.rng.random
            self.dt, last = now - last, now
            if self.chance(0.3 * a.damage_rate):
                self.damage()
            if a.publisher_damage and self.chance(0.05 * a.damage_rate):
                self.damage(publisher_side=True)
            if not self.pulls and self.chance(1.0):
                m = self.manifest()
                pick = None
                if m and m["versions"] and r() < 0.6:
                    listed = [v["version"] for v in m["versions"]]
                    near_damage = [v for v in listed for d in self.damaged.values() if 0 <= v - d["version"] <= 3]
                    pick = self.rng.choice(near_damage if near_damage and r() < 0.6 else listed[-3 * a.anchor_interval:])
                self.start_pull(pick)
            if not self.gcs and self.chance(0.3):
                self.start_gc()
            halfway = (deadline and now > t0 + a.duration / 2) or (a.versions and newest > a.versions / 2)
            if self.rgw_dir and self.rgw_down_until is None and (
                    self.chance(1 / 30) or (halfway and not self.kills["rgw"])):  # at least one outage
                self.kill_rgw()
            if self.commit_check_pending:
                self.check_commits()
            if now >= next_report:
                next_report = now + 10
                print(f"soak: {now - t0:.0f}s newest {newest}, held {dict(sorted(self.held.items()))}, "
                      f"kills {sum(self.kills.values())}, damaged {len(self.damaged)}", file=sys.stderr, flush=True)
            time.sleep(0.05)
        return self.finish(t0)

    def finish(self, t0):
        a = self.a
        self.final = True
        # writers and faults stop; radosgw comes back
        if self.rgw_down_until is not None:
            self.restart_rgw()
        if self.publisher is not None:
            self.publisher.proc.wait()
            self.reap_publisher()
        for c in self.gcs + self.pulls:
            c.proc.wait()
        self.reap_gcs()
        self.reap_pulls()
        if self.commit_check_pending:
            self.check_commits()
        # a last version after every fault: the final one every replica must reach by itself
        before = self.newest(fresh=True)
        for attempt in range(5):
            self.start_publisher(before + 1)
            if self.publisher is not None:
                self.publisher.proc.wait()
                self.reap_publisher()
            if self.newest(fresh=True) > before:
                break
            time.sleep(1)
        final = self.newest(fresh=True)
        if final == before:
            self.violation(f"the last publish (version {before + 1}, after every fault) failed; see {self.log.name}")
        for d in self.daemons:
            d["child"].cancel_kill()
        self.replica.cancel_kill()
        final_pulls = {"pull": self.start_pull(hf=False), "pull --hf-dir": None}
        deadline = time.monotonic() + a.settle_seconds
        replicas = [f"serve{i}/out" for i in range(len(self.daemons))] + ["serve0/shm", "replica_py", "pull",
                                                                          "pull --hf-dir"]
        replicas = [r for r in replicas if r != "serve0/shm" or self.daemons[0]["shm"]]
        final_ok = {}
        while time.monotonic() < deadline:
            for i in range(len(self.daemons)):
                self.observe_daemon(i)
            self.observe_replica()
            self.reap_pulls()
            for name, pull in final_pulls.items():  # one at a time; a failed one is retried
                if final_ok.get(name) or (pull is not None and pull in self.pulls) or self.pulls:
                    continue
                if getattr(pull, "result", None) and pull.result["version"] == final:
                    final_ok[name] = True
                else:
                    final_pulls[name] = self.start_pull(hf=name != "pull")
            for i, d in enumerate(self.daemons):
                got = read_out_dir(d["out"])
                if got and got[0] == final and got[1] == self.truth_of(final):
                    final_ok[f"serve{i}/out"] = True
                if d["shm"]:
                    got = read_shm(d["shm"])
                    if got and got[0] == final and got[1] == self.truth_of(final):
                        final_ok[f"serve{i}/shm"] = True
            if self.held.get("replica_py", 0) == final:
                final_ok["replica_py"] = True
            if all(final_ok.get(r) for r in replicas):
                break
            time.sleep(0.2)
        repairs = [r for r in replicas if not final_ok.get(r)]
        for r in repairs:
            self.violation(f"{r} did not reach the final version {final} by itself within {a.settle_seconds} s "
                           f"(held {self.held.get(r.split('/')[0], 0)})")
        # every writer stops, then an age-0 gc, then count leftovers
        for d in self.daemons:
            d["child"].stop()
            if d["child"].proc.returncode != 0:
                self.violation(f"serve daemon exited {d['child'].proc.returncode} on SIGTERM")
        self.replica.kill()
        gc = [self.bin, "gc", self.bucket.url, "--json", "--temp-older-than", "0"]
        if self.bucket.root is None:
            gc += ["--abort-uploads-older-than", "0"]
        r = subprocess.run(gc, capture_output=True)
        if r.returncode != 0:
            self.violation(f"the final gc failed: {r.stderr.decode().strip()}")
        left = self.bucket.temporaries()
        for d in self.daemons:
            left += temporaries_under(d["out"])
        left += temporaries_under(self.pull_dir)  # what SIGKILLed pulls left: the last pulls removed it
        for path in left:
            self.violation(f"temporary left behind: {path}")
        injected = len(self.damaged)
        publisher_side = sum(1 for d in self.damaged.values() if d["publisher_side"])
        refused = sum(1 for k in self.damaged if k in self.named)
        summary = (
            f"soak: {'PASS' if not self.violations else 'FAIL'} seed={a.seed} bucket={'s3' if self.bucket.root is None else 'local'} "
            f"seconds={time.monotonic() - t0:.0f} versions={final} "
            f"kills={sum(self.kills.values())} ({', '.join(f'{k} {v}' for k, v in self.kills.items() if v or k != 'rgw' or self.rgw_dir)}) "
            f"corruptions: injected={injected} refused={refused} routed_around={len(self.routed)} "
            f"never_needed={injected - refused} publisher_side={publisher_side} recovered_versions={len(self.recovered)} "
            f"states_checked={self.checked} divergent={self.divergent} "
            f"replicas_final_bit_exact={len(replicas) - len(repairs)}/{len(replicas)} repairs_needed={len(repairs)} "
            f"temporaries_left={len(left)} "
            f"pulls={self.notes['pulls']} pauses={self.notes['daemon_pauses']} gc_runs={self.notes['gc_runs']} commit_checks={self.notes['commit_checks']} "
            f"violations={len(self.violations)}")
        print(summary, flush=True)
        self.log.close()
        if not self.violations and not a.keep:
            shutil.rmtree(self.work, ignore_errors=True)
        elif self.violations:
            print(f"soak: kept {self.work} (children.log has the children's stderr)", file=sys.stderr)
        return 1 if self.violations else 0

    def cleanup(self):
        """After a harness error or Ctrl-C: no child stays, and no --shm region (a SIGTERMed daemon removes its own)."""
        for d in self.daemons:
            if d.get("child") is not None:
                d["child"].stop()
        for c in [self.publisher, self.replica] + self.pulls + self.gcs:
            if c is not None and c.running():
                c.kill()
        for d in self.daemons:
            if d["shm"] and os.path.exists(f"/dev/shm/{d['shm']}"):
                os.unlink(f"/dev/shm/{d['shm']}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration", type=float, default=0, help="seconds of faults (0: until --versions)")
    p.add_argument("--versions", type=int, default=0, help="stop after this many versions (0: until --duration)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--bucket", help="a directory or s3://bucket/prefix (default: a new directory in --workdir)")
    p.add_argument("--workdir", help="where the bucket, --out folders and logs go (default: a new temp dir)")
    p.add_argument("--keep", action="store_true", help="keep --workdir after a passing run")
    p.add_argument("--deltasync-bin", default=os.environ.get("DELTASYNC_BIN", os.path.join(ROOT, "build", "deltasync")))
    p.add_argument("--daemons", type=int, default=2)
    p.add_argument("--anchor-interval", type=int, default=10)
    p.add_argument("--cumulative-every", type=int, default=4)
    p.add_argument("--keep-anchors", type=int, default=3)
    p.add_argument("--kill-rate", type=float, default=0.5,
                   help="scales the kills: a pull is killed with half this chance; a daemon or the Python replica "
                        "with rate/10 per second")
    p.add_argument("--damage-rate", type=float, default=1.0, help="scales how often objects are damaged")
    p.add_argument("--publisher-damage", action=argparse.BooleanOptionalAction, default=True,
                   help="also damage objects between the newest anchor and the newest version, then kill the "
                        "publisher: its restart must publish past them (a recovered, anchor-only version)")
    p.add_argument("--stall-seconds", type=float, default=120)
    p.add_argument("--settle-seconds", type=float, default=90)
    p.add_argument("--verbose", "-v", action="store_true")
    # child roles
    p.add_argument("--role", choices=["publisher", "replica"], help=argparse.SUPPRESS)
    p.add_argument("--upto", type=int, help=argparse.SUPPRESS)
    p.add_argument("--pace", type=float, default=0, help=argparse.SUPPRESS)
    p.add_argument("--background", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.role:
        import roles
        return getattr(roles, a.role)(a) or 0
    if not a.duration and not a.versions:
        p.error("give --duration SECONDS or --versions N")
    if a.bucket and a.bucket.startswith("s3://") and not os.environ.get("AWS_ENDPOINT_URL"):
        p.error("an s3:// bucket needs AWS_ENDPOINT_URL and keys (source the env file of scripts/start-rgw.sh)")
    soak = Soak(a)
    try:
        return soak.run()
    finally:
        soak.cleanup()


if __name__ == "__main__":
    sys.exit(main())
