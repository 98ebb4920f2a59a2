"""The value domain, end to end (session 51, helper h3): every encoding and route ships special
bf16 bit patterns (+-0, NaN payloads and signs, signalling NaNs, +-Inf, subnormals, the largest
finite), other dtypes (F16, F64, integers, BOOL, U8, F8_E4M3/E5M2), odd shapes (0 elements,
scalars, 1 element, sizes around the 1024-gap block and the 65,536-element chunk) and fp32
masters bit for bit: `deltasync diff`/`apply` (raw, gap_delta fused and from the change list,
compact stream versions 2/3 in containers 1/2), `publish`/`pull` over anchors and deltas, and
the Python Publisher/Replica and torch routes. Files are written and read back with the official
`safetensors` package (torch tensors, so F8 is covered too); values are compared as bytes."""
import pytest

torch = pytest.importorskip("torch")
from safetensors.torch import load_file, save_file  # noqa: E402

# bf16 bit patterns: +0, -0, quiet NaNs with other payloads and signs, signalling NaNs, +-Inf,
# subnormals (smallest, largest), the largest finite of each sign, 1, -1, the smallest normal,
# values at the edges of the compact exponent classes (exponents 112, 113, 126, 127, 142, 254).
SPECIALS = [0x0000, 0x8000, 0x7FC0, 0x7FC1, 0xFFC0, 0xFFFF, 0x7F81, 0xFF81, 0x7F80, 0xFF80,
            0x0001, 0x8001, 0x007F, 0x807F, 0x7F7F, 0xFF7F, 0x3F80, 0xBF80, 0x0080, 0x3800,
            0x3880, 0x3F00, 0x3F7F, 0x4700, 0x7F00]

ENCODINGS = [("raw",), ("gap_delta",),
             ("compact", "--stream-version", "2", "--container", "1"),
             ("compact", "--stream-version", "2", "--container", "2"),
             ("compact", "--stream-version", "3", "--container", "1"),
             ("compact", "--stream-version", "3", "--container", "2")]


def bf16(bits):
    return torch.tensor([b - 0x10000 if b >= 0x8000 else b for b in bits], dtype=torch.int16).view(torch.bfloat16)


def f32(bits):
    return torch.tensor([b - 0x100000000 if b >= 0x80000000 else b for b in bits],
                        dtype=torch.int64).to(torch.int32).view(torch.float32)


def raw_bytes(t):
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def random_tensor(dtype, n, seed):
    """n elements of `dtype` with uniformly random bytes (every bit pattern, specials included)."""
    size = torch.empty(0, dtype=dtype).element_size()
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n * size,), dtype=torch.uint8, generator=g).view(dtype).clone()


def assert_same(got, want, label):
    assert set(got) >= set(want), label
    for name, w in want.items():
        g = got[name]
        assert (g.dtype, tuple(g.shape)) == (w.dtype, tuple(w.shape)), f"{label} {name}"
        assert raw_bytes(g) == raw_bytes(w), f"{label} {name}: bytes differ"


def diff_apply_everywhere(run, tmp_path, old, new, want=None, base=None):
    """`diff OLD NEW` in every encoding (raw and gap_delta also with --json, which encodes from the
    change list instead of the fused scan), then `apply BASE PATCH` (BASE: OLD unless given);
    OUT must hold `want` (default NEW) byte for byte."""
    save_file(old, tmp_path / "old.safetensors")
    save_file(new, tmp_path / "new.safetensors")
    base_path = tmp_path / "old.safetensors"
    if base is not None:
        base_path = tmp_path / "base.safetensors"
        save_file(base, base_path)
    for encoding in ENCODINGS:
        for json in ([False, True] if encoding[0] != "compact" else [False]):
            label = " ".join(encoding) + (" --json" if json else "")
            patch, out = tmp_path / "patch.safetensors", tmp_path / "out.safetensors"
            run("diff", tmp_path / "old.safetensors", tmp_path / "new.safetensors", "-o", patch,
                "--encoding", *encoding, "--allow-nonfinite", *(["--json"] if json else []))
            run("apply", base_path, patch, "-o", out)
            assert_same(load_file(out), want if want is not None else new, label)


def test_every_pair_of_special_bf16_patterns_is_shipped_bit_for_bit(tmp_path, run):
    # Every ordered pair (old, new), the unchanged ones included: sign-only changes (+0 -> -0),
    # NaN payload-only changes (0x7FC0 -> 0x7FC1), NaN <-> Inf, subnormal <-> 0.
    old = [a for a in SPECIALS for _ in SPECIALS]
    new = [b for _ in SPECIALS for b in SPECIALS]
    diff_apply_everywhere(run, tmp_path, {"w": bf16(old)}, {"w": bf16(new)})
    # And a tensor in which every element changes, to and from specials.
    diff_apply_everywhere(run, tmp_path, {"w": bf16(new)}, {"w": bf16([b ^ 0x8000 for b in new])})


@pytest.mark.parametrize("dtype", ["float16", "float64", "int64", "int32", "int16", "int8", "uint8", "bool",
                                   "float8_e4m3fn", "float8_e5m2", "uint16", "uint32", "uint64"])
def test_other_dtypes_ship_every_change_exactly(tmp_path, run, dtype):
    dt = getattr(torch, dtype)
    old, new = {"a": bf16([0x3F80, 0x3F80, 0x0000])}, {"a": bf16([0x3F80, 0x8000, 0x7FC1])}
    for n in (0, 1, 7, 1023, 1024, 1025):
        if dt == torch.bool:
            o = torch.arange(n) % 3 == 0
            w = o.clone()
            w[:1] = ~w[:1]
            w[-1:] = ~w[-1:]
        else:
            o = random_tensor(dt, n, n)
            w = o.clone()
            b = w.view(torch.uint8)
            if n:  # the first element's lowest byte, the last's top bit (the sign), one in the middle
                b[0] ^= 1
                b[-1] ^= 0x80
                b[b.numel() // 2] ^= 0x10
        old[f"x{n}"], new[f"x{n}"] = o, w
    old["scalar"], new["scalar"] = random_tensor(dt, 1, 99).reshape(()), random_tensor(dt, 1, 98).reshape(())
    diff_apply_everywhere(run, tmp_path, old, new)


def test_shapes_at_block_and_chunk_borders_first_last_or_every_element(tmp_path, run):
    for n in (1, 1023, 1024, 1025, 65535, 65536, 65537):
        o = random_tensor(torch.bfloat16, n, n)
        for where in ("first", "last", "all"):
            w = o.clone()
            bits = w.view(torch.int16)
            if where == "first":
                bits[0] ^= 1
            elif where == "last":
                bits[-1] ^= 1
            else:
                bits ^= 1
            old = {"w": o, "scalar": bf16([0x8000]).reshape(()), "empty": torch.zeros(0, 3, dtype=torch.bfloat16)}
            new = {"w": w, "scalar": bf16([0x0000]).reshape(()), "empty": torch.zeros(0, 3, dtype=torch.bfloat16)}
            diff_apply_everywhere(run, tmp_path, old, new)


# fp32 masters: ties to even (both directions), just below/above a tie, the largest finite
# bf16, values that round to +-Inf, +-Inf, subnormals that round up, down and to -0.
MASTERS = [0x3F808000, 0x3F818000, 0x3F808001, 0x3F80FFFF, 0x3F7FFFFF, 0x7F7F7FFF, 0x7F7F8000,
           0x7F7FFFFF, 0xFF7F8000, 0x7F800000, 0xFF800000, 0x00008000, 0x00018000, 0x80008000,
           0x807FFFFF, 0x00000001, 0x80000000, 0x00000000, 0x477FFFFF]


def test_fp32_masters_publish_what_torch_rounds_them_to(tmp_path, run):
    new = {"w": f32(MASTERS * 70)}  # 1330 elements: the SIMD body and its scalar tail
    want = {"w": new["w"].to(torch.bfloat16)}
    diff_apply_everywhere(run, tmp_path, {"w": torch.zeros(1330, dtype=torch.bfloat16)}, new, want=want)


def test_nan_masters_publish_a_quiet_nan_of_their_sign(tmp_path, run):
    # NaN masters (with --allow-nonfinite) become 0x7FC0 / 0xFFC0 on every path, the SIMD kernels'
    # and their scalar tails' alike (src/bf16/round.h: torch is not consistent here, its CPU
    # cast gives 0xFFFF and c10's scalar 0x7FC0, so deltasync keeps the sign).
    nans = [0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FC12345, 0xFF800001, 0x7FFFFFFF, 0xFFFFFFFF]
    want = bf16([0xFFC0 if b >> 31 else 0x7FC0 for b in nans] * 70)
    diff_apply_everywhere(run, tmp_path, {"w": torch.zeros(490, dtype=torch.bfloat16)},
                          {"w": f32(nans * 70)}, want={"w": want})


def test_publish_and_pull_every_version_of_mixed_dtypes_and_specials(tmp_path, run):
    def state(v):
        g = torch.Generator().manual_seed(v)
        pick = torch.randint(0, len(SPECIALS), (5000,), generator=g).tolist()
        big = random_tensor(torch.bfloat16, 65537, 7)
        big.view(torch.int16)[0], big.view(torch.int16)[-1] = -v, v
        return {"w": bf16([SPECIALS[i] for i in pick]), "big": big,
                "f16": random_tensor(torch.float16, 300, 100 + v), "f64": random_tensor(torch.float64, 300, 200 + v),
                "pos": torch.arange(300) + v * (torch.arange(300) % 7 == 0),
                "flag": torch.arange(50) % (v + 2) == 0, "u8": random_tensor(torch.uint8, 70, 300 + v),
                "f8": random_tensor(torch.float8_e4m3fn, 33, 400 + v),
                "f8b": random_tensor(torch.float8_e5m2, 33, 500 + v),
                "scalar": bf16([SPECIALS[v]]).reshape(()), "empty": torch.zeros(0, 3, dtype=torch.bfloat16),
                "x.e_score_correction_bias": random_tensor(torch.float32, 17, 600 + v)}

    states = [state(v) for v in range(1, 8)]
    for encoding in ("compact", "gap_delta", "raw"):
        bucket = tmp_path / f"bucket_{encoding}"
        for v, s in enumerate(states, 1):
            save_file(s, tmp_path / "in.safetensors")
            run("publish", bucket, tmp_path / "in.safetensors", "--version", v, "--encoding", encoding,
                "--anchor-interval", "3", "--allow-nonfinite", "-q")
        for v, s in enumerate(states, 1):  # anchors (1, 3, 6), deltas on them, chains of deltas
            run("pull", bucket, "-o", tmp_path / "pulled.safetensors", "--version", v, "-q")
            assert_same(load_file(tmp_path / "pulled.safetensors"), s, f"{encoding} version {v}")
        run("verify", bucket)


def test_apply_takes_the_fp32_old_that_diff_read(tmp_path, run):
    # `diff` reads fp32 OLD as published (rounded to bf16; a name ending in e_score_correction_bias
    # stays fp32) and names that state's hash in every patch; `apply` given the same OLD must apply
    # the patch to that state. It refused it ("another base, or the patches out of order").
    g = torch.Generator().manual_seed(3)
    old = {"w": torch.randn(3000, generator=g), "r.e_score_correction_bias": torch.randn(8, generator=g)}
    new = {k: v.clone() for k, v in old.items()}
    new["w"][::7] *= 1.01
    new["r.e_score_correction_bias"][2] = -0.0
    want = {"w": new["w"].to(torch.bfloat16), "r.e_score_correction_bias": new["r.e_score_correction_bias"]}
    diff_apply_everywhere(run, tmp_path, old, new, want=want)


# dtypes a torch trainer may hold beside bf16 that the C++ publisher carries bitwise.
TORCH_ONLY_DTYPES = ["float8_e4m3fn", "float8_e5m2", "uint16", "uint32", "uint64", "int8", "bool", "float16", "float64"]


def torch_states(versions):
    out = []
    for v in range(versions):
        s = {"w": random_tensor(torch.bfloat16, 2000, 900 + v)}
        for i, name in enumerate(TORCH_ONLY_DTYPES):
            dt = getattr(torch, name)
            s[name] = (torch.arange(300) % (v + 2) == 0) if dt == torch.bool else random_tensor(dt, 300, 10 * v + i)
        s["scalar_f8"] = random_tensor(torch.float8_e4m3fn, 1, v).reshape(())
        out.append(s)
    return out


@pytest.mark.parametrize("sparse", [False, True])
def test_torch_publish_and_replica_views_carry_every_dtype(tmp_path, sparse):
    # deltasync.torch.publish (dense from CPU tensors, or the DeviceTracker's sparse path), the
    # replica's torch views (deltasync.torch.tensors) and load_into, for the dtypes the C++
    # publisher carries bitwise: they refused F8 and the unsigned dtypes, which numpy arrays
    # publish (a raw TypeError from torch.from_numpy for a replica holding F8).
    deltasync_mod = pytest.importorskip("deltasync")
    import deltasync.torch as dst
    bucket = str(tmp_path / "bucket")
    states = torch_states(4)
    targets = {k: torch.empty_like(t) for k, t in states[0].items()}
    with deltasync_mod.Publisher(bucket, allow_nonfinite=True, anchor_interval=3) as pub:
        replica = deltasync_mod.Replica(bucket)
        for v, s in enumerate(states, 1):
            dst.publish(pub, v, s, sparse=sparse)
            assert replica.update() == v
            assert_same(dst.tensors(replica), s, f"version {v} views")
            dst.load_into(replica, targets)
            assert_same(targets, s, f"version {v} load_into")


@pytest.mark.parametrize("encoding", ["compact", "gap_delta", "raw"])
def test_publisher_from_fp32_masters_rounds_like_torch_every_version(tmp_path, encoding):
    # The C++ publisher's fused detect from fp32 masters (numpy arrays), version after version:
    # finite masters and +-Inf publish torch's .to(torch.bfloat16) bit for bit; NaN masters the
    # quiet NaN of their sign (src/bf16/round.h); a master that moves only within its bf16 value
    # changes nothing, one whose sign bit alone flips (0.0 -> -0.0) is a change.
    deltasync_mod = pytest.importorskip("deltasync")
    nans = [0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001, 0x7FFFFFFF]
    base = f32(MASTERS * 60 + nans * 12)
    rolls = [0, 1, 5, 5, 7]  # the same state twice in a row (version 4): nothing changes
    with deltasync_mod.Publisher(str(tmp_path / "bucket"), encoding=encoding, allow_nonfinite=True,
                                 anchor_interval=3) as pub:
        replica = deltasync_mod.Replica(str(tmp_path / "bucket"))
        for v, roll in enumerate(rolls, 1):
            masters = torch.roll(base, roll).contiguous()
            if v == 5:
                masters.view(torch.int32)[masters.view(torch.int32) == 0] = -0x80000000  # +0.0 -> -0.0
            pub.publish(v, {"w": masters.numpy()})
            assert replica.update() == v
            bits = masters.view(torch.int32)
            nan = (bits & 0x7FFFFFFF) > 0x7F800000
            want = masters.to(torch.bfloat16).view(torch.int16).clone()
            want[nan] = torch.where(bits[nan] < 0, -64, 0x7FC0).to(torch.int16)  # 0xFFC0 / 0x7FC0
            got = torch.from_numpy(replica.tensors()["w"].view("i2").copy())
            assert torch.equal(got, want), f"version {v}"


def test_inspect_names_the_tensors_of_a_delta_whose_base_holds_nan(tmp_path, run):
    # `inspect PATCH --base OLD` only names a container-2 delta's tensors from OLD (whose hash must
    # be the delta's base hash); it refused an OLD holding NaN (diff --allow-nonfinite wrote the
    # delta), and inspect has no --allow-nonfinite.
    old = {"w": bf16([0x3F80, 0x7FC1, 0x4000, 0xFF80]), "v": bf16([0x3F80, 0xFFC0])}
    new = {"w": bf16([0x3F80, 0x7FC1, 0x4040, 0xFF80]), "v": bf16([0x3F80, 0x7FC0])}
    save_file(old, tmp_path / "old.safetensors")
    save_file(new, tmp_path / "new.safetensors")
    run("diff", tmp_path / "old.safetensors", tmp_path / "new.safetensors", "-o", tmp_path / "d.safetensors",
        "--encoding", "compact", "--container", "2", "--allow-nonfinite")
    out = run("inspect", tmp_path / "d.safetensors", "--base", tmp_path / "old.safetensors").stdout
    named = [line.split() for line in out.splitlines() if line.strip().endswith("1 changed")]
    assert [(fields[0], fields[1]) for fields in named] == [("v", "BF16"), ("w", "BF16")], out
