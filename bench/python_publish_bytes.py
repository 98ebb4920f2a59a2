# Publishes a deterministic full-size model (Qwen3-0.6B shapes, fp32
# masters) through one Publisher over several versions (3.3%, 8%, 3.3%,
# none, 8% changed) and prints the SHA-256 of every object and each
# manifest entry (state hash, size, XXH3): run it with two builds of
# deltasync (PYTHONPATH pointing at one) and diff the outputs to check that
# a change keeps the published bytes.
#   python bench/python_publish_bytes.py THREADS WORKDIR > out.txt
import hashlib, json, os, sys, tempfile, shutil
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch
import deltasync, deltasync.torch as dt
from python_publish_bench import qwen3_shapes
threads = int(sys.argv[1]); out_dir = sys.argv[2]
print("deltasync from", deltasync.__file__, file=sys.stderr)
torch.manual_seed(0)
weights = {n: (torch.ones(s) if len(s) == 1 else torch.randn(s) * 0.02) for n, s in qwen3_shapes(28, 151936).items()}
gen = torch.Generator().manual_seed(1)
bucket = os.path.join(out_dir, "bucket")
shutil.rmtree(bucket, ignore_errors=True)
pub = deltasync.Publisher(bucket, anchor_interval=1_000_000, encoding="compact", threads=threads)
pub.publish(1, dt.to_publishable(weights))
for v, lr in enumerate([1e-6, 3e-6, 1e-6, 0.0, 3e-6], start=2):
    if lr:
        with torch.no_grad():
            for w in weights.values():
                w.add_(torch.randn(w.shape, generator=gen), alpha=lr)
    r = pub.publish(v, dt.to_publishable(weights))
    print(v, lr, r.changed_elements / r.total_elements, r.delta_bytes, file=sys.stderr)
pub.close()
for root, _, files in sorted(os.walk(bucket)):
    for f in sorted(files):
        p = os.path.join(root, f)
        rel = os.path.relpath(p, bucket)
        if rel.startswith("manifest"):
            m = json.load(open(p))
            for e in m.get("versions", []):
                print("state", e.get("version"), e.get("state_hash"), [(o.get("key"), o.get("size"), o.get("xxh3_128")) for o in e.get("objects", [])])
            continue
        print(rel, os.path.getsize(p), hashlib.sha256(open(p, "rb").read()).hexdigest())
shutil.rmtree(bucket, ignore_errors=True)
