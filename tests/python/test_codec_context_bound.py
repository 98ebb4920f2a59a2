"""bench/codec_context_bound.py: the ideal code lengths it prints are the
conditional entropies they claim to be."""
import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from safetensors.torch import save_file  # noqa: E402

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "bench")
sys.path.insert(0, BENCH)
import codec_context_bound as ccb  # noqa: E402


def test_conditional_bits_is_the_conditional_entropy():
    # Context 0 holds two equally likely symbols (1 bit each), context 1 one.
    assert ccb.conditional_bits(np.array([0, 0, 1, 1]), np.array([0, 1, 5, 5])) == pytest.approx(2.0)
    # Without the context the same four symbols cost 1.5 bits each.
    assert ccb.conditional_bits(np.zeros(4, np.int64), np.array([0, 1, 5, 5])) == pytest.approx(6.0)
    assert ccb.conditional_bits(np.array([3]), np.array([-7])) == 0.0


def _states(tmp_path):
    """Three steps in which exactly the elements of exponent 120 move up one
    ULP each step: the exponent decides every flag and difference."""
    rng = np.random.default_rng(1)
    exp = rng.choice([119, 120, 121], size=4096)
    s0 = ((exp << 7) | rng.integers(0, 100, size=4096)).astype(np.int16)
    moving = exp == 120
    steps = [(s0 + k * moving).astype(np.int16) for k in range(3)]
    run = tmp_path / "run"
    run.mkdir()
    for i, s in enumerate(steps):
        save_file({"w": torch.from_numpy(s.copy()).view(torch.bfloat16)}, str(run / f"step-{i}.safetensors"))
    return run, steps


def test_a_deciding_exponent_costs_nothing(tmp_path):
    run, steps = _states(tmp_path)
    to_bits = lambda s: {"w": s.view(np.uint16).astype(np.int64)}  # noqa: E731
    changed, h0, bits, again = ccb.step_bits(to_bits(steps[0]), to_bits(steps[1]), to_bits(steps[2]))
    assert changed == int((steps[1] != steps[2]).sum()) > 0
    assert h0 > 0
    assert bits["exponent"] == pytest.approx(0.0, abs=1e-9)
    assert again == 1.0
    out = subprocess.run([sys.executable, os.path.join(BENCH, "codec_context_bound.py"), str(tmp_path)],
                         capture_output=True, text=True, check=True).stdout
    header = next(line for line in out.splitlines() if line.startswith("| run | step"))
    row = next(line for line in out.splitlines() if line.startswith("| run | 2 | "))
    cells = dict(zip([c.strip() for c in header.split("|")[1:-1]], [c.strip() for c in row.split("|")[1:-1]]))
    for label in ccb.CONTEXTS:
        assert cells[f"{label} / H0"] == "0.000"
        # Learning the frequencies costs something, and less than order 0.
        assert 0.0 < float(cells[f"{label} adaptive / H0"]) < 1.0
    assert cells["P(moves if moved)"] == "1.000"


def test_adaptive_bits_is_the_sequential_adaptive_code_length():
    """The closed form equals coding the symbols one by one, each with the
    probability (count so far + alpha) / (context's count so far + K alpha),
    in any order."""
    rng = np.random.default_rng(7)
    ctx = rng.integers(0, 3, size=500)
    sym = np.where(rng.random(500) < 0.8, 1, rng.integers(-3, 4, size=500))
    alphabet, alpha = 7, 1 / 16
    for order in (np.arange(500), rng.permutation(500)):
        seen: dict = {}
        bits = 0.0
        for i in order:
            c, s = int(ctx[i]), int(sym[i])
            in_ctx = sum(n for (cc, _), n in seen.items() if cc == c)
            bits -= np.log2((seen.get((c, s), 0) + alpha) / (in_ctx + alphabet * alpha))
            seen[(c, s)] = seen.get((c, s), 0) + 1
        keys, counts = ccb.symbol_counts(ctx, sym)
        assert ccb.adaptive_bits(keys, counts, alphabet, alpha) == pytest.approx(bits, rel=1e-9)
    # A shared layout pools the tensors' counts.
    flags = [ccb.symbol_counts(np.zeros(4, np.int64), np.array([0, 1, 0, 1]))] * 2
    diffs = [ccb.symbol_counts(np.zeros(2, np.int64), np.array([1, 1]))] * 2
    pooled = ccb.adaptive_bits(*ccb.merge_counts(flags), 2, 0.5) + \
        min(ccb.adaptive_bits(*ccb.merge_counts(diffs), 1, a) for a in (0.5, 1 / 16)) + 16
    assert ccb.adaptive_step_bits(flags, diffs) == pytest.approx(min(pooled, 2 * (
        ccb.adaptive_bits(*flags[0], 2, 0.5)) + min(2 * ccb.adaptive_bits(*diffs[0], 1, a) for a in (0.5, 1 / 16)) + 16))


def test_no_runs_is_a_clear_error(tmp_path):
    r = subprocess.run([sys.executable, os.path.join(BENCH, "codec_context_bound.py"), str(tmp_path)],
                       capture_output=True, text=True)
    assert r.returncode != 0 and "--keep-states" in r.stderr


def test_row_flags_pay_where_changes_keep_to_rows():
    """Changes only in 4 of 64 rows, at random inside them: the row flags
    (64 flags, 4 set) plus the flags inside those rows cost less than every
    element's flag in its exponent's context; spread over every row, the
    rows cannot win and the column falls back to the exponent's length."""
    rng = np.random.default_rng(3)
    rows, cols = 64, 128
    old = ((rng.choice([119, 120], size=(rows, cols)) << 7) | rng.integers(0, 100, size=(rows, cols))).astype(np.int64)
    for hot in (rng.choice(rows, size=4, replace=False), np.arange(rows)):
        mask = np.zeros((rows, cols), bool)
        mask[hot] = rng.random((hot.size, cols)) < 0.5
        new = old + mask
        flag = mask.reshape(-1).astype(np.int64)
        exp = (old.reshape(-1) >> 7) & 0xFF
        exp_bits = ccb.conditional_bits(exp, flag)
        want = ccb.binary_bits(int(mask.any(axis=1).sum()), rows) + ccb.conditional_bits(
            exp[np.repeat(mask.any(axis=1), cols)], flag[np.repeat(mask.any(axis=1), cols)])
        assert ccb.row_flag_bits(exp, flag, cols) == pytest.approx(want)
        _, _, bits, _ = ccb.step_bits(None, {"m": old.reshape(-1)}, {"m": new.reshape(-1)}, {"m": cols})
        idx = np.flatnonzero(flag)
        diff_bits = ccb.conditional_bits(exp[idx], np.ones(idx.size, np.int64))
        assert bits[ccb.ROWS] == pytest.approx(min(exp_bits, want) + diff_bits)
        if hot.size == 4:
            assert bits[ccb.ROWS] < 0.5 * bits["exponent"]
        else:
            assert bits[ccb.ROWS] == pytest.approx(bits["exponent"])
        # Without the rows the column is the exponent's.
        _, _, flat, _ = ccb.step_bits(None, {"m": old.reshape(-1)}, {"m": new.reshape(-1)})
        assert flat[ccb.ROWS] == pytest.approx(flat["exponent"])
    assert ccb.binary_bits(0, 10) == 0.0 and ccb.binary_bits(5, 10) == pytest.approx(10.0)


def test_neighbour_signs_are_the_rank_one_prediction_from_row_column_and_corner():
    # A 3x4 matrix; changes at (0,1) up, (0,3) down, (1,1) down, (1,3) ?, (2,0) up, (2,3) ?.
    idx = np.array([1, 3, 5, 7, 8, 11])
    for up7, up11 in ((1, 0), (0, 1)):
        up = np.array([1, 0, 0, up7, 1, up11])
        got = ccb.neighbour_signs(idx, up, 4)
        # (1,3): row (1,1) down, column (0,3) down, corner (0,1) up: two downs -> up.
        # (2,3): row (2,0) up, column (1,3), corner (1,0) not a change -> none.
        assert list(got) == [2, 2, 2, 1, 2, 2]


def test_signs_oracle_finds_a_rank_one_sign_pattern_and_no_more():
    """Moves of +-1 ULP whose directions are a_i * b_j (a rank-1 gradient's
    signs): the previous change in the row and in the column predict them, so
    the +signs length is far below the exponent's; with random directions it
    is not below it. The row oracle wins where the rates differ by row."""
    rng = np.random.default_rng(5)
    rows, cols = 64, 256
    old = ((120 << 7) | rng.integers(0, 100, size=(rows, cols))).astype(np.int64)  # positive values
    mask = rng.random((rows, cols)) < 0.7  # most changes then have a corner
    for signs, low_rank in ((np.outer(rng.choice([-1, 1], rows), rng.choice([-1, 1], cols)), True),
                            (rng.choice([-1, 1], size=(rows, cols)), False)):
        new = old + mask * signs
        _, _, bits, _ = ccb.step_bits(None, {"m": old.reshape(-1)}, {"m": new.reshape(-1)}, {"m": cols})
        flag_bits = ccb.conditional_bits(np.zeros(rows * cols, np.int64), mask.reshape(-1).astype(np.int64))
        if low_rank:
            assert bits["+signs"] - flag_bits < 0.6 * (bits["exponent"] - flag_bits)
        else:
            # (an empirical conditional entropy never rises with a context: a few bits of overfit)
            assert bits["+signs"] >= bits["exponent"] - 20
        assert bits["row oracle"] <= bits["exponent"] + 1e-6 and bits["col oracle"] <= bits["exponent"] + 1e-6
        assert bits["row gain adaptive"] == 0.0  # same rate in every row: learning rows only costs
    hot = np.zeros((rows, cols), bool)
    hot[: rows // 2] = rng.random((rows // 2, cols)) < 0.5
    _, _, bits, _ = ccb.step_bits(None, {"m": old.reshape(-1)}, {"m": (old + hot).reshape(-1)}, {"m": cols})
    assert bits["row oracle"] < 0.65 * bits["exponent"]  # 1 bit a flag in half the rows against H(1/4)
    assert bits["col oracle"] == pytest.approx(bits["exponent"], rel=0.1)
    # 256 elements a row are enough to learn its rate: most of the oracle's gain stays.
    assert bits["row gain adaptive"] > 0.7 * (bits["exponent"] - bits["row oracle"])
