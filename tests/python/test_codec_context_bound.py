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
    assert "| run | 2 | " in out and "| 0.000 | 0.000 | 0.000 | 0.000 | 1.000 |" in out


def test_no_runs_is_a_clear_error(tmp_path):
    r = subprocess.run([sys.executable, os.path.join(BENCH, "codec_context_bound.py"), str(tmp_path)],
                       capture_output=True, text=True)
    assert r.returncode != 0 and "--keep-states" in r.stderr
