"""scripts/start-rgw.sh called the way a program calls it: both outputs read
through pipes (Python's capture_output, as bench/speed_report.py does).

Its daemons once inherited the script's progress descriptor (fd 3, a copy of
its stderr), so such a caller waited for the pipe's end as long as the
cluster ran: speed_report.py hung at "start-rgw.sh" until someone closed it
by hand (session 46). The script must return as soon as it has printed its
env file, and the server it started must answer.
"""
import os
import shutil
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ("ceph-mon", "ceph-osd", "radosgw", "radosgw-admin", "ceph")


def _env_of(env_file: Path) -> dict:
    out = {}
    for line in env_file.read_text().splitlines():
        if line.startswith("export ") and "=" in line:
            key, value = line[len("export "):].split("=", 1)
            out[key] = value.strip().strip("'\"")
    return out


@pytest.mark.skipif(any(shutil.which(t) is None for t in TOOLS),
                    reason="Ceph is not installed (scripts/install-deps.sh --test installs it)")
def test_start_rgw_returns_when_its_outputs_are_pipes(tmp_path):
    env = dict(os.environ, TMPDIR=str(tmp_path))
    try:
        try:
            proc = subprocess.run(["bash", str(ROOT / "scripts/start-rgw.sh")], capture_output=True, text=True,
                                  env=env, timeout=180)
        except subprocess.TimeoutExpired:
            pytest.fail("start-rgw.sh did not return within 180 s with its stdout and stderr read through pipes "
                        "(a daemon holding one of them open?)")
        assert proc.returncode == 0, proc.stderr[-3000:]
        env_file = Path(proc.stdout.strip().splitlines()[-1])
        assert env_file.parent.parent == tmp_path
        s3 = _env_of(env_file)
        # An anonymous ListBuckets: any HTTP answer (403 included) is the server answering.
        try:
            with urllib.request.urlopen(s3["AWS_ENDPOINT_URL"], timeout=10) as r:
                status = r.status
        except urllib.error.HTTPError as e:
            status = e.code
        assert 200 <= status < 500
        assert "radosgw answering" in proc.stderr
    finally:
        for d in tmp_path.glob("deltasync-rgw.*"):
            subprocess.run(["bash", str(ROOT / "scripts/stop-rgw.sh"), str(d)], capture_output=True, timeout=60)
