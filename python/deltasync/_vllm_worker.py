"""The vLLM glue of ``deltasync.vllm``: ``DeltaSyncWeightTransferEngine``, the engine on vLLM
0.33.0's ``WeightTransferEngine`` (built on first use, so that ``deltasync.vllm`` imports
without vLLM): its default callbacks are the model's ``load_weights`` and vLLM's checkpoint
patch loader, and its delivery follows docs/vllm.md ("Delivery rules"): names and shapes
checked first, changed elements scattered in place where the parameter is what runs
(``_vllm_layout.py``), the rest through vLLM's layerwise reload of whole modules.
``deltasync.vllm`` serves the class (module ``__getattr__``) and registers it (``register``).
"""
from __future__ import annotations

import time

import numpy as np
import torch

from ._vllm_info import DeltaSyncInitInfo, DeltaSyncUpdateInfo

_engine_class = None


def _vllm_engine_class():
    """Builds DeltaSyncWeightTransferEngine: DeltaSyncEngine on vLLM's WeightTransferEngine."""
    global _engine_class
    if _engine_class is not None:
        return _engine_class
    from vllm.distributed.weight_transfer.base import WeightTransferEngine
    from .vllm import DeltaSyncEngine  # (deltasync.vllm imports this module; it calls here once it defined that)

    class DeltaSyncWeightTransferEngine(DeltaSyncEngine, WeightTransferEngine):
        """The deltasync backend inside a vLLM worker (vLLM 0.33.0's engine contract)."""

        init_info_cls = DeltaSyncInitInfo
        update_info_cls = DeltaSyncUpdateInfo
        supports_draft_weight_update = False

        def __init__(self, config, vllm_config, device, model) -> None:
            WeightTransferEngine.__init__(self, config, vllm_config, device, model)
            self._setup("", 0, device, None, None)

        def _default_load_weights(self):
            return self._vllm_load_weights

        def _default_apply_patches(self):
            return self._vllm_apply_patches

        def _synchronize(self) -> None:
            # As vLLM's own update_weights does, so the next step sees the weights.
            if self.device.type != "cpu" and torch.accelerator.is_available():
                torch.accelerator.synchronize()

        def update_weights(self, update_info, load_weights=None, apply_patches=None) -> None:
            DeltaSyncEngine.update_weights(self, update_info, load_weights, apply_patches)

        def _vllm_load_weights(self, weights) -> None:
            self.model.load_weights(weights)

        def _deliver(self, src, names, changes, load_weights, apply_patches):
            if load_weights != self._vllm_load_weights:  # the caller's callbacks
                return DeltaSyncEngine._deliver(self, src, names, changes, load_weights, apply_patches)
            from ._vllm_layout import EngineLayout

            layout = EngineLayout(self.model)
            layout.check(names)  # names and shapes, before anything is touched
            layout.check_shapes(src, names)
            layout.check_dtypes(src, names)  # a cast that rounds is refused, before anything is touched
            if changes is None:
                self._check_covered(layout, names)
            stale = layout.stale_aliases(names)  # a tied lm_head's kernel copy: re-derived after the writes
            try:
                return self._deliver_checked(layout, src, names, changes)
            finally:
                layout.refresh_aliases(stale)

        def _check_covered(self, layout, names) -> None:
            """An engine started with dummy (random) weights takes a whole version only if it covers
            every parameter: one it lacks would keep its random values (vLLM's own loader refuses
            such a checkpoint). Engines loaded from a checkpoint keep its values (frozen tensors)."""
            fmt = getattr(getattr(self.vllm_config, "load_config", None), "load_format", "")
            if str(getattr(fmt, "value", fmt)) != "dummy":
                return
            missing = sorted(set(layout.targets) - set(names))
            if missing:
                more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
                raise ValueError(f"the engine was started with load_format='dummy' (random weights) and the "
                                 f"version has no {', '.join(missing[:5])}{more}: they would keep random values; "
                                 "publish every parameter (frozen ones too) or start from the checkpoint")

        def _deliver_checked(self, layout, src, names, changes):
            # In place only where a write into the parameter is what runs
            # (unquantized, not repacked); the rest is reloaded whole, layerwise.
            reload = [n for n in names if not layout.plain(n)] if self.init_info.layerwise_reload else []
            if reload:
                reload = layout.complete(reload, src)  # whole fused groups, from the replica's state
            direct = [n for n in names if n not in set(reload)]
            elements = 0
            self._touched = True
            if reload:
                elements += self._reload_layerwise(src, reload)
            if direct and changes is None:
                elements += DeltaSyncEngine._deliver_dense(self, self._vllm_load_weights, src, direct, full=True)
            elif direct:
                elements += self._scatter(layout, src, direct, changes, set(reload))
            if changes is None:
                kind = "dense"
            else:
                kind = "sparse_flat" if not reload else ("reload" if not direct else "sparse_flat+reload")
            return kind, elements

        def _scatter(self, layout, src, names, changes, reload=()) -> int:
            """Changed elements straight into the plain parameters (through the fused/TP mapping):
            the node follower's planned tensors in one native call, the others one by one; vLLM's
            patch loader for any tensor the layout cannot map."""
            rest, elements = [], 0
            t0 = time.perf_counter()
            planned = self._planned or {}
            if planned:
                elements += self._plan.scatter(skip=reload)
            for name in names:
                if name in planned:
                    continue
                idx = torch.from_numpy(np.asarray(changes[name]).astype(np.int64, copy=False))
                vals = self._values[name] if self._values is not None else src[name].reshape(-1).index_select(0, idx)
                if layout.scatter(name, idx, vals):
                    elements += idx.numel()
                else:
                    rest.append(name)
            self._delivery_notes = {"scattered_tensors": len(names) - len(rest), "patched_tensors": len(rest),
                                    "planned_tensors": sum(1 for n in names if n in planned),
                                    "scatter_s": time.perf_counter() - t0}
            if rest:
                patches = self._patches(src, rest, changes)
                self._vllm_apply_patches(patches)
                elements += sum(p.indices.numel() for p in patches)
            return elements

        def _shm_plan(self, region):
            from ._shm_plan import Plan
            from ._vllm_layout import EngineLayout

            # Rebuilt when the region was mapped again or a parameter moved (a reload may replace them).
            key = (region.generation, id(region), tuple(p.data_ptr() for p in self.model.parameters()))
            if self._plan is None or self._plan_key != key:
                t0 = time.perf_counter()
                layout = EngineLayout(self.model)
                places = {n: pl for n in layout.targets if (pl := layout.place(n)) is not None}
                self._plan, self._plan_key = Plan(region, places), key
                self._plan_built_s = time.perf_counter() - t0
            return self._plan

        def _plan_key_now(self, region):
            return (region.generation, id(region), tuple(p.data_ptr() for p in self.model.parameters()))

        def _db_swapped(self) -> None:
            self._plan_key = self._plan_key_now(self._region)  # the plan was retargeted with the parameters

        def _db_verify(self, override):
            from ._vllm_layout import verify_engine

            return lambda src: verify_engine(self.model, src, list(src), override)

        def _db_build(self, region, plan):
            from ._vllm_double import build_for_model

            return build_for_model(self.model, self.device, self.vllm_config, region, plan)

        def _needs_full_source(self) -> bool:
            # whole tensors for the verification and for layerwise reloads (packed weights)
            if self.init_info.verify or self._whole_only:
                return True
            from ._vllm_layout import EngineLayout

            layout = EngineLayout(self.model)
            return self.init_info.layerwise_reload and not all(layout.plain(n) for n in layout.targets)

        def _reload_layerwise(self, src, names) -> int:
            # Checkpoint-format loads go through vLLM's layerwise reload, as its
            # NCCL and IPC engines do; finalised whatever happens, so no
            # parameter is left on the meta device.
            from vllm.model_executor.model_loader.reload import (
                finalize_layerwise_reload,
                initialize_layerwise_reload,
            )

            initialize_layerwise_reload(self.model)
            try:
                return DeltaSyncEngine._deliver_dense(self, self._vllm_load_weights, src, names, full=False)
            finally:
                finalize_layerwise_reload(self.model, self.model_config)

        def _verify(self, src, names) -> int:
            from ._vllm_layout import verify_engine

            return verify_engine(self.model, src, names)

        def _vllm_apply_patches(self, patches) -> None:
            from vllm.model_executor.model_loader.checkpoint_weight_patch import (
                CheckpointWeightPatch,
                load_checkpoint_weight_patches,
            )

            load_checkpoint_weight_patches(self.model, [
                CheckpointWeightPatch(name=p.name, shape=tuple(p.full_shape), dtype=p.values.dtype,
                                      values=p.values, indices=p.indices)
                for p in patches
            ], validate_unique_indices=False)  # the replica's indices are strictly ascending

    _engine_class = DeltaSyncWeightTransferEngine
    return _engine_class
