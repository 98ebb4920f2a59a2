"""`deltasync bench --sweep`: one JSON object per (scale, rate) with the
replica's compact apply figures and their floor, and the changed fraction
it was asked for."""
import json

import pytest


def test_sweep_reports_every_size_and_rate(run):
    r = run("bench", "--sweep", "--quick", "--scales", "0.02,0.04", "--rates", "0.01,0.2")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout.strip().splitlines()[-1])
    assert [(x["scale"], x["rate"]) for x in rows] == [(0.02, 0.01), (0.02, 0.2), (0.04, 0.01), (0.04, 0.2)]
    for x in rows:
        assert x["model_bytes"] > 0 and x["delta_bytes"] > 0
        assert x["changed"] / (x["model_bytes"] / 2) == pytest.approx(x["rate"], rel=0.1)
        for key in ("apply_compact_gbps", "apply_compact_vs_memcpy", "decode_compact_gbps_per_core", "memcpy_gbps"):
            assert x[key] > 0
        # The SIMD route the figures were measured on ("AVX3", "AVX2", "NEON", ...): one process, one route.
        assert isinstance(x["simd_target"], str) and x["simd_target"] == rows[0]["simd_target"] != ""
        # The same delta's floor (bench_decode_floor.h): every stage timed, the sums reported.
        for key in ("decode_floor_gbps_per_core", "apply_floor_vs_memcpy", "decode_compact_cpu_gbps_per_core"):
            assert x[key] > 0
        for stage in ("read", "read_threads", "parse", "output", "hash", "hash_streamed", "scatter", "read_scatter",
                      "read_scatter_threads", "digest", "decode_library"):
            assert x[f"floor_{stage}_ns_per_change"] > 0 and x[f"floor_{stage}_s_per_gb"] > 0
        # The apply floor sums the hash in cache ("hash"), not the one streamed from memory, which no
        # decoder pays (it hashes each chunk's changes right after decoding them).
        s = {k: x[f"floor_{k}_s_per_gb"] for k in ("read_scatter_threads", "digest", "parse", "hash")}
        apply_floor = s["read_scatter_threads"] + (s["digest"] + s["parse"] + s["hash"]) / x["threads"]
        assert 1 / x["apply_floor_gbps"] == pytest.approx(apply_floor, rel=1e-9)
        # The decode floor: read, parse and output on one core.
        decode_floor = sum(x[f"floor_{k}_s_per_gb"] for k in ("read", "parse", "output"))
        assert 1 / x["decode_floor_gbps_per_core"] == pytest.approx(decode_floor, rel=1e-9)
        # A word with a change lies in a block with one.
        assert 0 < x["floor_words_with_change"] <= x["floor_blocks_with_change"] <= 1
    # A bigger model is bigger; a higher rate makes a bigger delta.
    assert rows[2]["model_bytes"] > rows[0]["model_bytes"]
    assert rows[1]["delta_bytes"] > rows[0]["delta_bytes"]


@pytest.mark.parametrize("flag", [["--scales", "0"], ["--rates", "1.5"]])
def test_sweep_refuses_sizes_and_rates_out_of_range(run, flag):
    r = run("bench", "--sweep", *flag, check=False)
    assert r.returncode != 0
    assert flag[0] in r.stderr
