#!/usr/bin/env python3
"""How far can a context take the compact codec on real weights? (issue 16)

Reads the bf16 states that `bench/real_model_bench.py --keep-states DIR`
kept (one folder per (lr, start), step-0 .. step-N safetensors) and prints,
per step, the ideal code length of the step's changes under several contexts,
as a fraction of the order-0 entropy of (gap, ULP difference) that
`deltasync bench` and the real-model bench report (`entropy_bytes_per_changed`,
computed here by the same function). An ideal coder spends exactly the
conditional entropy; a real one spends more (compact v3 spends 1.06-1.23x the
exponent-class figure), so a column above the codec's target rules that
context out. The contexts, each for the changed flag of every element and for
the ULP difference of every changed one:

  exponent      the base value's exponent byte (what compact v2/v3 use)
  +density      and the number of changes among the 32 elements before it
                (0, 1, 2, 3+): a decoder knows them
  +previous     and the element's move in the previous step (down, none, up):
                a decoder would need the previous delta's positions
  +both         all three
  +history      the exponent, the steps since the element last changed in
                the kept states (1, 2, 3, 4-7, 8+, never) and that change's
                direction: a decoder that kept each element's last change
                (a byte per element) knows them; +previous is its first
                bucket
  +rows         (ideal only) the exponent, with a flag per row of a matrix
                (its last dimension) saying whether the row holds a change,
                sent at its own entropy: rows without one cost nothing more;
                per tensor the cheaper of this and the exponent alone (the
                choice is one bit per tensor, not counted)
  row oracle    (ideal only, an upper bound for any row or column context)
  col oracle    the changed flag with the exponent and the element's row
                (resp. column) of a matrix as context, every (exponent, row)
                rate known for free: what a coder that knew each row's (each
                column's) change rate exactly could reach, without paying for
                the rates; the difference as for the exponent
  row gain      what learning those row rates gains instead: per matrix, the
  adaptive      changed flags' adaptive length with the exponent as context
                minus the cheaper of that and the adaptive length with
                (exponent, row) as context (Krichevsky-Trofimov, as below), as
                a fraction of H0: 0 when no matrix's row rates pay for their
                learning
  +signs        (ideal only) the exponent for the flag, and for the
                difference the exponent plus the direction that a rank-1
                pattern of directions would give it, from the previous change
                in its row, the previous one in its column and the change at
                their corner (a decoder has all three; none when one is
                missing): do the moves' signs follow a low-rank gradient's?

Those are ideal code lengths with the frequencies known for free: a real
coder must also send or learn them, which costs most where a context holds
few elements (small tensors, rare exponents). So each context also gets an
"adaptive" column: the exact code length of an adaptive arithmetic coder
that learns every frequency as it goes (a Krichevsky-Trofimov estimator,
Dirichlet(alpha) prior, per context: the length depends only on the counts,
not on their order, so it is computed in closed form). Per step the coder
takes the cheaper of two model layouts (a delta-wide choice a stream could
signal in one byte): one set of models per tensor, or one set shared by
every tensor of the delta; the ULP differences use the step's alphabet (the
distinct differences, charged 16 bits each) and the better of two priors
(alpha 1/2 and 1/16). An arithmetic coder comes within a few bytes per
stream of this length, so a column above the codec's target rules the
context out for any coder, not just an ideal one.

  .venv/bin/python bench/real_model_bench.py --lrs 3e-6,1e-5 --steps 5 --keep-states /tmp/states
  .venv/bin/python bench/codec_context_bound.py /tmp/states
"""

from __future__ import annotations

import argparse
import glob
import math
import os
import re
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from real_model_bench import tensor_entropy_bits  # noqa: E402

WINDOW = 32
CONTEXTS = ("exponent", "+density", "+previous", "+both", "+history")
ROWS = "+rows"
ORACLES = ("row oracle", "col oracle", "+signs", "row gain adaptive")


def conditional_bits(ctx: np.ndarray, sym: np.ndarray) -> float:
    """sum over elements of -log2 P(sym | ctx), P the empirical frequencies;
    sym in (-2^17, 2^17)."""
    if ctx.size == 0:
        return 0.0
    keys, count = np.unique(ctx * (1 << 18) + sym + (1 << 17), return_counts=True)
    _, of_ctx = np.unique(keys >> 18, return_inverse=True)
    per_ctx = np.bincount(of_ctx, weights=count)
    count = count.astype(np.float64)
    return float(-(count * np.log2(count / per_ctx[of_ctx])).sum())


_LGAMMA = np.vectorize(math.lgamma, otypes=[np.float64])


def adaptive_bits(keys: np.ndarray, counts: np.ndarray, alphabet: int, alpha: float) -> float:
    """Code length in bits of an adaptive coder (Dirichlet(alpha) prior over
    `alphabet` symbols, one model per context) for the symbols counted as
    (context << 18 | symbol + 2^17) -> count; independent of their order."""
    if keys.size == 0:
        return 0.0
    ctx, of_ctx = np.unique(keys >> 18, return_inverse=True)
    per_ctx = np.bincount(of_ctx, weights=counts)
    a = alphabet * alpha
    nats = float((_LGAMMA(per_ctx + a) - math.lgamma(a)).sum() - (_LGAMMA(counts + alpha) - math.lgamma(alpha)).sum())
    return nats / math.log(2)


def symbol_counts(ctx: np.ndarray, sym: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    keys, count = np.unique(ctx * (1 << 18) + sym + (1 << 17), return_counts=True)
    return keys, count.astype(np.float64)


def merge_counts(parts: list) -> tuple[np.ndarray, np.ndarray]:
    if not parts:
        return np.zeros(0, np.int64), np.zeros(0)
    keys = np.concatenate([k for k, _ in parts])
    counts = np.concatenate([c for _, c in parts])
    merged, at = np.unique(keys, return_inverse=True)
    return merged, np.bincount(at, weights=counts)


def adaptive_step_bits(flags: list, diffs: list) -> float:
    """The adaptive coder's bits for one context: `flags` and `diffs` hold per
    tensor (keys, counts) of the changed flag and of the ULP difference. The
    cheaper layout (models per tensor, or shared) and prior win."""
    alphabet = np.unique(np.concatenate([k & ((1 << 18) - 1) for k, _ in diffs])).size if diffs else 0
    table = 16.0 * alphabet
    best = math.inf
    for layout in ("per tensor", "shared"):
        f = [merge_counts(flags)] if layout == "shared" else flags
        d = [merge_counts(diffs)] if layout == "shared" else diffs
        flag_bits = sum(adaptive_bits(k, c, 2, 0.5) for k, c in f)
        diff_bits = min(sum(adaptive_bits(k, c, alphabet, alpha) for k, c in d) for alpha in (0.5, 1 / 16))
        best = min(best, flag_bits + diff_bits + table)
    return best


def load_bits(path: str, row_len: dict | None = None) -> dict:
    """Every bf16 tensor's bits, flattened; `row_len`, if given, gets each
    matrix's row length (its last dimension)."""
    import torch
    from safetensors.torch import load_file

    out = {}
    for k, v in load_file(path).items():
        if v.dtype != torch.bfloat16:
            continue
        out[k] = v.reshape(-1).view(torch.int16).numpy().view(np.uint16).astype(np.int64)
        if row_len is not None and v.dim() >= 2 and v.numel() > 0:
            row_len[k] = int(v.shape[-1])
    return out


def binary_bits(ones: int, n: int) -> float:
    """n flags, `ones` of them set, at their order-0 entropy."""
    if ones in (0, n):
        return 0.0
    p = ones / n
    return -n * (p * math.log2(p) + (1 - p) * math.log2(1 - p))


def row_flag_bits(exp: np.ndarray, flag: np.ndarray, row_len: int) -> float:
    """The changed flags coded as a flag per row (any change in it?) and,
    in the rows with one, each element's flag in its exponent's context."""
    rows = flag.reshape(-1, row_len).any(axis=1)
    inside = np.repeat(rows, row_len)
    return binary_bits(int(rows.sum()), rows.size) + conditional_bits(exp[inside], flag[inside])


def neighbour_signs(idx: np.ndarray, up: np.ndarray, row_len: int) -> np.ndarray:
    """Per change (flat indices `idx`, ascending; `up` 1 for a move up, 0
    down): the direction that a rank-1 pattern of directions (a_i * b_j, as
    one outer product of gradients gives) predicts from changes a decoder
    already has: with (i, j') the previous change in its row, (i', j) the
    previous one in its column, and (i', j') a change too, the product of
    the three directions; 0 down, 1 up, 2 when one of the three is missing."""
    row, col = idx // row_len, idx % row_len
    prev_in_row = np.full(idx.size, -1, np.int64)
    same = np.flatnonzero(row[1:] == row[:-1]) + 1
    prev_in_row[same] = same - 1
    order = np.lexsort((row, col))  # column by column, rows ascending
    prev_in_col = np.full(idx.size, -1, np.int64)
    same = np.flatnonzero(col[order][1:] == col[order][:-1]) + 1
    prev_in_col[order[same]] = order[same - 1]
    both = np.flatnonzero((prev_in_row >= 0) & (prev_in_col >= 0))
    corner_at = row[prev_in_col[both]] * row_len + col[prev_in_row[both]]
    pos = np.minimum(np.searchsorted(idx, corner_at), idx.size - 1)
    found = idx[pos] == corner_at
    out = np.full(idx.size, 2, np.int64)
    k, c = both[found], pos[found]
    downs = (1 - up[prev_in_row[k]]) + (1 - up[prev_in_col[k]]) + (1 - up[c])
    out[k] = 1 - downs % 2  # an even number of downs: the product points up
    return out


def oracle_bits(o: np.ndarray, exp: np.ndarray, flag: np.ndarray, idx: np.ndarray, diff: np.ndarray,
                row_len: int | None) -> dict:
    """The ORACLES' bits for one tensor: ideal lengths (the exponent's where
    it is not a matrix), and the adaptive row gain (0 where it is not)."""
    exp_flags, exp_diffs = conditional_bits(exp, flag), conditional_bits(exp[idx], diff)
    if not row_len:
        return {**dict.fromkeys(ORACLES, exp_flags + exp_diffs), "row gain adaptive": 0.0}
    at = np.arange(o.size)
    by_exp = adaptive_bits(*symbol_counts(exp, flag), 2, 0.5)
    by_row = adaptive_bits(*symbol_counts(exp * (o.size // row_len + 1) + at // row_len, flag), 2, 0.5)
    value_up = ((diff > 0) == (o[idx] < 0x8000)).astype(np.int64)  # the value's direction, not the pattern's
    return {"row oracle": conditional_bits(exp * (o.size // row_len + 1) + at // row_len, flag) + exp_diffs,
            "col oracle": conditional_bits(exp * row_len + at % row_len, flag) + exp_diffs,
            "+signs": exp_flags + conditional_bits(exp[idx] * 3 + neighbour_signs(idx, value_up, row_len), diff),
            "row gain adaptive": by_exp - min(by_exp, by_row)}


def age_bucket(age: np.ndarray) -> np.ndarray:
    """Steps since an element's last change -> 0 (never), 1, 2, 3, 4 (4-7), 5 (8+)."""
    return np.select([age <= 0, age <= 3, age <= 7], [0, age, 4], 5)


def step_bits(before: dict | None, old: dict, new: dict, row_len: dict | None = None,
              history: dict | None = None, step: int = 0) -> tuple[int, float, dict, float]:
    """(changed, order-0 bits, {context: bits}, P(moves | moved in the
    previous step)) of the step old -> new; `bits` holds each context's ideal
    length and, under "<context> adaptive", the adaptive coder's. `row_len`
    (from load_bits) gives the matrices' rows for the "+rows" column; a
    tensor without one there gets the exponent's length. `history` maps a
    tensor to (the step of each element's last change, -1 if none; its
    direction 0 down / 2 up, 1 if none) before this step, `step` this step's
    number: the "+history" context; both are updated here."""
    changed, h0, bits = 0, 0.0, dict.fromkeys(CONTEXTS + (ROWS,) + ORACLES, 0.0)
    counted = {label: ([], []) for label in CONTEXTS}
    moved_before = moved_again = 0
    for name, o in old.items():
        n = new[name]
        c, h, _ = tensor_entropy_bits(o.astype(np.uint16), n.astype(np.uint16))
        if c == 0:
            continue
        changed, h0 = changed + c, h0 + h
        flag = (o != n).astype(np.int64)
        idx = np.flatnonzero(flag)
        diff = n[idx] - o[idx]
        exp = (o >> 7) & 0xFF
        seen = np.concatenate([[0], np.cumsum(flag)])
        at = np.arange(o.size)
        density = np.minimum(seen[at] - seen[np.maximum(at - WINDOW, 0)], 3)
        prev = np.ones_like(o) if before is None else np.sign(o - before[name]) + 1
        moved_before += int((prev != 1).sum())
        moved_again += int(((prev != 1) & (flag == 1)).sum())
        if history is not None and name not in history:
            history[name] = (np.full(o.size, -1, np.int64), np.ones(o.size, np.int64))
        last_step, last_dir = history[name] if history is not None else (np.full(o.size, -1, np.int64),
                                                                         np.ones(o.size, np.int64))
        hist = (exp * 6 + age_bucket(np.where(last_step < 0, 0, step - last_step))) * 3 + last_dir
        for label, ctx in (("exponent", exp), ("+density", exp * 4 + density), ("+previous", exp * 3 + prev),
                           ("+both", (exp * 4 + density) * 3 + prev), ("+history", hist)):
            # The difference takes the context minus density (a decoder knows
            # the flags before the difference either way).
            dctx = exp if label in ("exponent", "+density") else hist if label == "+history" else exp * 3 + prev
            bits[label] += conditional_bits(ctx, flag) + conditional_bits(dctx[idx], diff)
            counted[label][0].append(symbol_counts(ctx, flag))
            counted[label][1].append(symbol_counts(dctx[idx], diff))
        last_step[idx] = step
        last_dir[idx] = np.sign(diff) + 1
        exp_flags = conditional_bits(exp, flag)
        rows = row_flag_bits(exp, flag, row_len[name]) if row_len and name in row_len else exp_flags
        bits[ROWS] += min(exp_flags, rows) + conditional_bits(exp[idx], diff)
        for label, b in oracle_bits(o, exp, flag, idx, diff, (row_len or {}).get(name)).items():
            bits[label] += b
    for label in CONTEXTS:
        bits[label + " adaptive"] = adaptive_step_bits(*counted[label])
    return changed, h0, bits, moved_again / moved_before if moved_before else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("states", help="the --keep-states folder of bench/real_model_bench.py")
    args = ap.parse_args()
    runs = sorted(d for d in glob.glob(os.path.join(args.states, "*")) if os.path.isdir(d))
    if not runs:
        sys.exit(f"codec_context_bound: no run folders in '{args.states}' (run bench/real_model_bench.py "
                 "--keep-states there first)")
    columns = [c for label in CONTEXTS for c in (label, label + " adaptive")] + [ROWS, *ORACLES]
    print("| run | step | changed | H0 B/chg | " + " | ".join(f"{c} / H0" for c in columns) + " | P(moves if moved) |")
    print("|---|---|---|---|" + "---|" * (len(columns) + 1))
    for run in runs:
        paths = sorted(glob.glob(os.path.join(run, "step-*.safetensors")),
                       key=lambda p: int(re.search(r"step-(\d+)", p).group(1)))
        row_len: dict = {}
        states = [load_bits(p, row_len) for p in paths]
        history: dict = {}
        for s in range(1, len(states)):
            changed, h0, bits, again = step_bits(states[s - 2] if s >= 2 else None, states[s - 1], states[s], row_len,
                                                 history, s)
            if changed == 0:
                continue
            cells = " | ".join(f"{bits[c] / h0:.3f}" for c in columns)
            print(f"| {os.path.basename(run)} | {s} | {changed} | {h0 / 8 / changed:.3f} | {cells} | {again:.3f} |", flush=True)


if __name__ == "__main__":
    main()
