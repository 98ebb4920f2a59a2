"""deltasync._shm_double.DoubleBuffer over a real `deltasync serve --shm` region and plain torch parameters.

The next version is prepared into shadow tensors outside the pause (the
plan's seqlock-bracketed read, a scatter, a verification); the swap gives the
same Parameter objects the shadows' storage (a tied alias follows), and the
old storage catches up afterwards. A shadow that fails verification, a move
from another version than the engine's, or a version other than the one
asked for is never swapped in.
"""

import torch

import deltasync
import deltasync.torch as dt
from deltasync._shm_double import DoubleBuffer
from deltasync._shm_plan import Place, Plan
from test_shm_region import serving, wait_version


def same_bits(a, b):
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def moved(s, frac, seed):
    g = torch.Generator().manual_seed(seed)
    out = {n: t.clone() for n, t in s.items()}
    for t in out.values():
        bits = t.view(-1).view(torch.int16)
        bits[torch.randperm(bits.numel(), generator=g)[:max(1, int(bits.numel() * frac))]] += 1
    return out


def first_state():
    g = torch.Generator().manual_seed(7)
    return {"a.weight": torch.randn(64, 48, generator=g).to(torch.bfloat16),
            "c.weight": torch.randn(512, 256, generator=g).to(torch.bfloat16),
            "d.bias": torch.randn(300, generator=g).to(torch.bfloat16)}


class Tiny(torch.nn.Module):
    """Parameters holding the checkpoint tensors whole; ``tied.c`` is ``c`` itself (a tied weight)."""

    def __init__(self, s):
        super().__init__()
        self.a = torch.nn.Parameter(s["a.weight"].clone(), requires_grad=False)
        self.c = torch.nn.Parameter(s["c.weight"].clone(), requires_grad=False)
        self.d = torch.nn.Parameter(s["d.bias"].clone(), requires_grad=False)
        self.tied = torch.nn.Module()
        self.tied.c = self.c

    def by_name(self):
        return {"a.weight": self.a, "c.weight": self.c, "d.bias": self.d}


def double_buffer(region, model):
    params = list(model.by_name().values())
    places = {n: Place(p.data.view(-1), tuple(p.shape), 0, p.numel()) for n, p in model.by_name().items()}
    plan = Plan(region, places, 2)
    owner = [next(i for i, q in enumerate(params) if q is model.by_name()[n]) for n in plan.names]
    return DoubleBuffer(plan, params, owner)


def verifier(model, db):
    """Compares the shadows (in their parameters' places) with whole tensors of the version."""
    def verify(src):
        shadow_of = {id(p): s for p, s in zip(db.params, db.shadows)}
        bad = [n for n, p in model.by_name().items() if not same_bits(shadow_of[id(p)], src[n])]
        if bad:
            raise deltasync.IntegrityError(f"shadows differ: {', '.join(bad)}")
        return len(src)
    return verify


def unchanged(s, t, name="a.weight"):
    """An element of ``name`` that the move from ``s`` to ``t`` keeps."""
    return int((s[name].view(-1).view(torch.int16) == t[name].view(-1).view(torch.int16)).nonzero()[0])


def assert_holds(model, state, what):
    for n, p in model.by_name().items():
        assert same_bits(p.data, state[n]), f"{n} at {what}"
    assert model.tied.c is model.c and same_bits(model.tied.c, state["c.weight"]), what


def test_prepare_outside_then_swap_then_catch_up(deltasync_bin, bucket):
    states = {1: first_state()}
    for v in range(2, 6):
        states[v] = moved(states[v - 1], 0.03, v)
    model = Tiny(states[1])
    ids = {n: id(p) for n, p in model.by_name().items()}
    with serving(deltasync_bin, bucket, states[1]) as (name, pub, proc):
        region = wait_version(name, 1, proc)
        db = double_buffer(region, model)
        verify = verifier(model, db)
        assert db.prepare(region, 1, verify).startswith("nothing newer") and db.version == 1  # copied whole
        dt.publish(pub, 2, states[2])
        wait_version(name, 2, proc)  # the same mapping sees it (one region per daemon)
        assert db.prepare(region, 1, verify) == "ready" and db.prepared["verified"] == 3
        assert_holds(model, states[1], "version 1 while 2 is prepared")  # the parameters are untouched
        assert db.swap(3, 1) is None and db.swap(2, 2) is None  # another version, another base: no swap
        old = {n: p.data.data_ptr() for n, p in model.by_name().items()}
        assert db.swap(2, 1)["elements"] > 0
        assert_holds(model, states[2], "version 2 after the swap")
        assert {n: id(p) for n, p in model.by_name().items()} == ids  # the same Parameter objects
        assert {s.data_ptr() for s in db.shadows} == set(old.values())  # the old storage is the shadow now
        assert db.pending == (1, 2) and same_bits(db.shadows[1], states[1]["c.weight"])
        # outside the pause: the old storage catches up with the same changes
        assert db.prepare(region, 2, verify).startswith("nothing newer") and db.version == 2 and db.pending is None
        for p, s in zip(db.params, db.shadows):
            assert same_bits(p.data, s)
        # and the next version: prepared into the other buffer, swapped back
        dt.publish(pub, 3, states[3])
        wait_version(name, 3, proc)
        assert db.prepare(region, 2, verify) == "ready"
        assert db.swap(3, 2) is not None
        assert_holds(model, states[3], "version 3 after the second swap")
        assert {n: p.data.data_ptr() for n, p in model.by_name().items()} == old  # back on the first storage

        # A shadow that fails verification is never swapped in; the engine keeps its version.
        assert db.prepare(region, 3, verify).startswith("nothing newer")
        db.shadows[0].view(-1).view(torch.int16)[unchanged(states[3], states[4])] ^= 1  # one the move keeps
        dt.publish(pub, 4, states[4])
        wait_version(name, 4, proc)
        why = db.prepare(region, 3, verify)
        assert "failed verification" in why and db.version == 0 and db.prepared is None, why
        assert db.swap(4, 3) is None
        assert_holds(model, states[3], "version 3 after a failed verification")
        assert db.prepare(region, 3, verify) == why  # not tried again for the same move
        # the in-place route moves the parameters; the shadows are re-copied, then prepared again
        db.before_other_route()
        taken = region.take(4, 3, full=False, plan=db.plan)
        assert taken is not None and db.plan.scatter() > 0
        assert_holds(model, states[4], "version 4 in place")
        assert db.prepare(region, 4, verify).startswith("nothing newer") and db.version == 4
        for p, s in zip(db.params, db.shadows):
            assert same_bits(p.data, s)

        # The region moved twice past the engine (its change lists start at 5): not prepared, no swap.
        dt.publish(pub, 5, states[5])
        wait_version(name, 5, proc)
        states[6] = moved(states[5], 0.03, 6)
        dt.publish(pub, 6, states[6])
        wait_version(name, 6, proc)
        why = db.prepare(region, 4, verify)
        assert "move from 5" in why and db.prepared is None and db.swap(6, 4) is None, why
        assert_holds(model, states[4], "version 4 with the region two versions ahead")


def test_without_verification_a_bad_shadow_is_what_the_guard_catches(deltasync_bin, bucket):
    """The same scribbled shadow, prepared without ``verify``, would be swapped in wrong: what the
    verification in the test above guards against (and why tests run with it on)."""
    s1 = first_state()
    s2 = moved(s1, 0.03, 2)
    model = Tiny(s1)
    with serving(deltasync_bin, bucket, s1) as (name, pub, proc):
        region = wait_version(name, 1, proc)
        db = double_buffer(region, model)
        db.prepare(region, 1)
        db.shadows[0].view(-1).view(torch.int16)[unchanged(s1, s2)] ^= 1
        dt.publish(pub, 2, s2)
        wait_version(name, 2, proc)
        assert db.prepare(region, 1) == "ready" and db.swap(2, 1) is not None
        assert not same_bits(model.a.data, s2["a.weight"])
