"""A restarted trainer and its zombie on one bucket, as real processes.

The zombie opened the bucket at version 3 and publishes version 4 after the
restarted trainer has committed 4..10: its objects have the keys of the
committed versions. It must fail (ConflictError) before it uploads anything,
so that `verify --all` passes and replicas hold the restarted trainer's
weights. On a local bucket, and on S3 when AWS_ENDPOINT_URL names a server
(scripts/start-rgw.sh).
"""
import os
import subprocess
import sys
import uuid

import numpy as np
import pytest

import deltasync

WEIGHTS = r"""
import numpy as np
def weights(version, seed):
    rng = np.random.default_rng(seed * 1000 + version)
    base = np.random.default_rng(7).standard_normal(20000).astype(np.float32) * 0.02
    return {"w": base + rng.standard_normal(20000).astype(np.float32) * 0.002,
            "b": np.full(300, 0.25 + 0.01 * version, dtype=np.float32)}
"""
exec(WEIGHTS)  # the same weights() in this process and in the children

TRAINER = WEIGHTS + r"""
import sys, deltasync
bucket, first, last, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
with deltasync.Publisher(bucket, anchor_interval=10, create_bucket=True) as pub:
    for v in range(first, last + 1):
        pub.publish(v, weights(v, seed))
"""

ZOMBIE = WEIGHTS + r"""
import sys, deltasync
pub = deltasync.Publisher(sys.argv[1])
print(pub.latest_version, flush=True)
sys.stdin.readline()  # the restarted trainer publishes meanwhile
try:
    pub.publish(4, weights(4, seed=99))
except deltasync.ConflictError as e:
    print("conflict:", e, flush=True)
    sys.exit(3)
print("published", flush=True)
"""


BUCKETS = [
    pytest.param("local", id="local"),
    pytest.param("s3", id="s3", marks=pytest.mark.skipif(
        not os.environ.get("AWS_ENDPOINT_URL"), reason="AWS_ENDPOINT_URL not set (scripts/start-rgw.sh)")),
]


@pytest.mark.parametrize("kind", BUCKETS)
def test_a_zombie_publisher_cannot_destroy_the_restarted_trainers_versions(kind, tmp_path, run):
    bucket = str(tmp_path / "bucket") if kind == "local" else f"s3://ds-zombie-{uuid.uuid4().hex[:12]}/run"
    subprocess.run([sys.executable, "-c", TRAINER, bucket, "1", "3", "1"], check=True, timeout=120)
    zombie = subprocess.Popen([sys.executable, "-c", ZOMBIE, bucket], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert zombie.stdout.readline().strip() == "3"
        # The restarted trainer (another process) continues the numbering.
        subprocess.run([sys.executable, "-c", TRAINER, bucket, "4", "10", "1"], check=True, timeout=120)
        out, err = zombie.communicate("go\n", timeout=120)
    finally:
        if zombie.poll() is None:
            zombie.kill()
            zombie.wait()
    assert zombie.returncode == 3, (out, err)

    verified = run("verify", bucket, "--all", check=False)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    replica = deltasync.Replica(bucket)
    assert replica.update() == 10
    got = replica.tensors()
    want = weights(10, 1)
    for name, array in want.items():
        bf16 = (array.view(np.uint32) + 0x7FFF + ((array.view(np.uint32) >> 16) & 1)) >> 16
        np.testing.assert_array_equal(np.asarray(got[name]).view(np.uint16), bf16.astype(np.uint16), err_msg=name)
    assert "another publisher wrote" in out and "nothing of it was uploaded" in out, out
