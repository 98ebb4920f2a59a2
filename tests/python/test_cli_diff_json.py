"""`deltasync diff --json`: one JSON object with the sizes and the delta's
order-0 and per-class entropy, the figures `deltasync bench` reports (checked
here on a delta small enough to work out by hand)."""
import json
import math

import ml_dtypes
import numpy as np
from safetensors.numpy import save_file


def test_diff_json_reports_sizes_and_entropy(tmp_path, run):
    old = np.ones(8, dtype=np.float32).astype(ml_dtypes.bfloat16)
    new = old.copy()
    bits = new.view(np.uint16)
    bits[[1, 5]] += 1  # +1 ULP at indices 1 and 5: gaps 1 and 3, differences 1 and 1
    save_file({"w": old}, tmp_path / "old.safetensors")
    save_file({"w": new}, tmp_path / "new.safetensors")
    for encoding in ("gap_delta", "compact"):
        out = tmp_path / f"{encoding}.safetensors"
        proc = run("diff", tmp_path / "old.safetensors", tmp_path / "new.safetensors", "-o", out,
                   "--encoding", encoding, "--version", 3, "--json")
        j = json.loads(proc.stdout.strip().splitlines()[-1])
        assert j["output"] == str(out)
        assert j["encoding"] == encoding
        assert (j["changed_tensors"], j["changed_elements"], j["total_elements"]) == (1, 2, 8)
        assert j["changed_fraction"] == 0.25
        assert j["size_bytes"] == out.stat().st_size
        assert j["bytes_per_changed_element"] == out.stat().st_size / 2
        # Gaps {1, 3}: 1 bit each; differences {1, 1}: 0 bits. 2 bits / 8 / 2 changed.
        assert j["entropy_bytes_per_changed"] == 0.125
        # One exponent class of 8 elements, 2 changed: the flag's binary
        # entropy over the class; the difference is certain in it.
        flag_bits = -(2 * math.log2(2 / 8) + 6 * math.log2(6 / 8))
        assert math.isclose(j["context_entropy_bytes_per_changed"], flag_bits / 8 / 2, rel_tol=1e-12)


def test_diff_json_without_changes_has_null_figures(tmp_path, run):
    w = np.ones(4, dtype=np.float32).astype(ml_dtypes.bfloat16)
    save_file({"w": w}, tmp_path / "a.safetensors")
    proc = run("diff", tmp_path / "a.safetensors", tmp_path / "a.safetensors", "-o", tmp_path / "d.safetensors",
               "--json")
    j = json.loads(proc.stdout)
    assert j["changed_elements"] == 0
    assert j["bytes_per_changed_element"] is None
    assert j["entropy_bytes_per_changed"] is None
    assert j["context_entropy_bytes_per_changed"] is None
