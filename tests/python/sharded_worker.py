"""One rank of a sharded trainer for tests/python/test_torch_sharded.py.

Run as ``python sharded_worker.py SCENARIO RANK WORLD INIT_FILE BUCKET OUT``;
every rank publishes its part through deltasync.torch.attach, and rank 0
saves the full parameters (gathered with full_tensor(), in the test only) of
every committed version to OUT/v{version}.pt.
"""
import os
import signal
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

import deltasync
import deltasync.torch as dt

VOCAB, DIM = 37, 16  # 37 rows: not divisible by 2 or 4


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(DIM)
        self.qkv = torch.nn.Linear(DIM, 3 * DIM)
        self.proj = torch.nn.Linear(DIM, DIM)
        self.up = torch.nn.Linear(DIM, 3 * DIM)
        self.down = torch.nn.Linear(3 * DIM, DIM)

    def forward(self, h):
        q, k, v = self.qkv(self.norm(h)).chunk(3, dim=-1)
        a = torch.softmax(q @ k.transpose(-1, -2) / DIM**0.5, dim=-1) @ v
        h = h + self.proj(a)
        return h + self.down(torch.nn.functional.gelu(self.up(h)))


class Transformer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, DIM)
        self.layers = torch.nn.ModuleList([Block(), Block()])
        self.norm = torch.nn.LayerNorm(DIM)
        self.head = torch.nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, x):
        h = self.embed(x)
        for layer in self.layers:
            h = layer(h)
        return self.head(self.norm(h))


def full_params(model):
    out = {}
    for name, p in model.named_parameters():
        t = p.full_tensor() if isinstance(p, DTensor) else p
        out[name] = t.detach().clone()
    return out


def main():
    scenario, rank, world, init_file, bucket, out = sys.argv[1:]
    rank, world = int(rank), int(world)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = Transformer()
    start = os.path.join(out, "start.pt")
    if os.path.exists(start):  # a restarted job continues from the weights it stopped at
        model.load_state_dict(torch.load(start))
    if scenario == "hsdp":
        mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("replicate", "shard"))
    elif scenario in ("fsdp_tp", "fsdp_tp_uneven"):
        mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("dp", "tp"))
    else:
        mesh = init_device_mesh("cpu", (world,))
    if scenario == "pipeline":
        # Rank 1 holds a stage rank 0 does not have: not one model.
        if rank == 1:
            model.extra = torch.nn.Linear(DIM, DIM)
    if scenario == "shard1":
        # Every matrix split by columns (Shard(1)); vectors by rows.
        for module in model.modules():
            for pname, p in list(module.named_parameters(recurse=False)):
                placement = Shard(1) if p.dim() == 2 else Shard(0)
                setattr(module, pname, torch.nn.Parameter(distribute_tensor(p.data, mesh, [placement])))
    elif scenario in ("fsdp_tp", "fsdp_tp_uneven"):
        # FSDP2 + TP as torchtitan does it: Megatron-style TP inside each block
        # (q/k/v and up column-parallel, proj and down row-parallel), then FSDP
        # over the data-parallel dimension: column-parallel weights get
        # (_StridedShard(0), Shard(0)), row-parallel ones (Shard(0), Shard(1)),
        # and the rest live on the "dp" sub-mesh, replicated across "tp".
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
        for layer in model.layers:
            parallelize_module(layer, mesh["tp"], {"qkv": ColwiseParallel(), "up": ColwiseParallel(),
                                                   "proj": RowwiseParallel(), "down": RowwiseParallel()})
            fully_shard(layer, mesh=mesh["dp"])
        if scenario == "fsdp_tp_uneven":  # 37 vocabulary rows over 2 x 2: refused at attach, by name
            parallelize_module(model, mesh["tp"], {"head": ColwiseParallel()})
        fully_shard(model, mesh=mesh["dp"])
    elif scenario != "pipeline":
        for layer in model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    if scenario == "badbucket" and rank == 1:
        bucket = "s3:" + bucket  # "s3:/tmp/...": refused on this rank alone, when its part publisher opens
    if scenario == "pipeline":
        # A setting parts do not support is refused at attach, before anything else, naming the setting.
        try:
            dt.attach(model, optimizer, deltasync.Publisher(bucket, cumulative_interval=3))
        except deltasync.InvalidArgumentError as e:
            with open(os.path.join(out, f"setting-refused-{rank}.txt"), "w") as f:
                f.write(str(e))
    # PUBLISHER=plain: the same call as a single-process trainer's, on every rank.
    plain = os.environ.get("PUBLISHER") == "plain"
    publisher = (deltasync.Publisher(bucket, anchor_interval=4, threads=1) if plain
                 else dt.ShardedPublisher(bucket, anchor_interval=4, threads=1))
    try:
        handle = dt.attach(model, optimizer, publisher)
    except (deltasync.InvalidArgumentError, deltasync.FailedPreconditionError) as e:
        with open(os.path.join(out, f"refused-{rank}.txt"), "w") as f:
            f.write(str(e))
        dist.destroy_process_group()
        return
    steps = int(os.environ.get("STEPS", "6"))
    fail_at = int(os.environ.get("FAIL_AT", "0"))
    fail_rank = int(os.environ.get("FAIL_RANK", "1"))
    g = torch.Generator().manual_seed(1)
    for step in range(1, steps + 1):
        if scenario == "shard1":
            # Gradients of the same values on every rank (no DTensor forward needed).
            for p in model.parameters():
                grad = torch.randn(p.shape, generator=g)
                p.grad = distribute_tensor(grad, p.device_mesh, p.placements)
        else:
            x = torch.randint(0, VOCAB, (4, 8), generator=g)
            loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), x.flatten())
            loss.backward()
        if step == fail_at and rank == fail_rank:
            if os.environ.get("FAIL_MODE") == "kill":
                # SIGKILLed in the middle of publishing its part.
                native = handle._native

                class Killed:
                    def __getattr__(self, name):
                        return getattr(native, name)

                    def publish(self, *args):
                        os.kill(os.getpid(), signal.SIGKILL)

                handle._native = Killed()
            else:
                handle.fail_next_publish = True
        version = handle.next_version
        optimizer.step()
        optimizer.zero_grad()
        failed = False
        try:
            handle.flush()
        except deltasync.FailedPreconditionError as e:
            failed = True
            if rank == 0:
                print(f"step {step}: {e}", flush=True)
        full = full_params(model)  # every rank takes part in the gather
        if rank == 0 and not failed:
            torch.save(full, os.path.join(out, f"v{version}.pt"))
        if rank == 0 and failed:
            with open(os.path.join(out, "failed.txt"), "a") as f:
                f.write(f"{version}\n")
    if plain:
        publisher.flush()  # waits for the parts, as for a single-process Publisher
        # No rank opened the bucket as a whole (no full-model rebuild on any rank).
        assert publisher._opened is None, "a rank opened the whole bucket"
        try:  # its ranks publish parts: publishing through it directly is refused
            publisher.publish(10**6, {"x": torch.zeros(2)})
            raise AssertionError("a direct publish() after attach was not refused")
        except deltasync.FailedPreconditionError as e:
            assert "use the handle attach() returned" in str(e)
    handle.remove()
    full = full_params(model)  # a collective: every rank
    if rank == 0:
        torch.save(full, os.path.join(out, "end.pt"))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
