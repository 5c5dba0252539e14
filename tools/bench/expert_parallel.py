"""Training steps per second and bytes per process of a mixture-of-experts model on 2 CPU processes
(gloo): expert parallel (``ParallelismConfig(ep_size=2)``) against the same model data-parallel with
FSDP2 (``ParallelismConfig(dp_shard_size=2)``), and that against FSDP2 applied by hand.

    .venv/bin/python tools/bench/expert_parallel.py [--steps 10] [--repeats 3]

The model: ``DEPTH`` blocks, each a dense mixing layer and a mixture-of-experts layer (a router picking
the top 2 of ``EXPERTS`` experts per token; stacked experts ``WIDTH -> HIDDEN -> WIDTH``), so the experts
hold about 98% of the parameters. Each process trains on ``BATCH`` samples of ``[TOKENS, WIDTH]`` per
step with AdamW, in three loops:

- **ep**: the Accelerator with ``ParallelismConfig(ep_size=2)``: each process holds 4 of the 8 experts
  of every block, tokens go to their expert's process and back by all-to-all; the rest of the model is
  sharded with FSDP2 over the same 2 processes;
- **dp prepared**: the Accelerator with ``ParallelismConfig(dp_shard_size=2)``: every parameter,
  experts included, sharded with FSDP2 and all-gathered block by block;
- **by hand**: plain PyTorch, ``fully_shard`` on each block then on the root over a 1-D mesh of 2 (what
  the dp-prepared loop does, without the Accelerator).

Each worker alternates the three loops ``--repeats`` times and keeps the best time of each, so all see
the same machine; one untimed step first fills the optimizer state. After that step (before
``zero_grad``) each process counts the bytes of the distinct local storages behind its parameters,
gradients and AdamW state (as ``fsdp_memory.py`` does), and splits each part into experts and the rest
by its local tensors' bytes.

Goal: dp prepared / by hand >= 0.97 (the Accelerator adds nothing to FSDP2's step). No goal is set on
ep / dp prepared: neither layout is the other's baseline, and which is faster depends on the model and
the interconnect, not on accel. What a user should read from it is the trade of the two layouts'
traffic: per expert layer and step, FSDP2 all-gathers the layer's experts forward and again backward
and reduce-scatters their gradients (bytes that grow with the experts' size), while expert parallelism
never gathers an expert and sends each routed (token, choice) row out and back by all-to-all, forward
and backward (bytes that grow with the tokens per step times top-k), after a blocking exchange of
per-expert counts. Here the experts' bytes are the larger (16 MiB of experts per block against 0.5 MiB
of routed rows per process), so ep measures faster; with fewer or smaller experts, or many more tokens
per step, the all-to-alls cost more than FSDP2's gathers (on gloo more than on NCCL), and an unbalanced
router makes the busiest process everyone's pace (``accelerator.expert_token_counts``). Between steps
both layouts hold half of every byte on each of the 2 processes; they differ in what is transient.
The last step's loss of the three loops is printed so the comparison is seen to be of the same
computation. The reference ``accelerate`` release has no expert parallelism, so no reference column
is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time

EXPERTS, WIDTH, HIDDEN, DEPTH, TOP_K = 8, 256, 1024, 4, 2
BATCH, TOKENS = 16, 16


def _model():
    import torch

    class StackedExperts(torch.nn.Module):
        """Experts of the documented contract: ``num_experts`` and parameters stacked ``[num_experts, ...]``;
        the forward reads the experts only through those, so expert parallelism can run it on a slice."""

        def __init__(self) -> None:
            super().__init__()
            self.num_experts = EXPERTS
            self.up = torch.nn.Parameter(torch.randn(EXPERTS, HIDDEN, WIDTH) * WIDTH**-0.5)
            self.down = torch.nn.Parameter(torch.randn(EXPERTS, WIDTH, HIDDEN) * HIDDEN**-0.5)

        def forward(self, hidden_states, top_k_index, top_k_weights):
            out = torch.zeros_like(hidden_states)
            for expert in range(self.num_experts):
                token, choice = torch.where(top_k_index == expert)
                if token.numel():
                    h = torch.relu(hidden_states[token] @ self.up[expert].T) @ self.down[expert].T
                    out.index_add_(0, token, h * top_k_weights[token, choice, None])
            return out

    class MoEBlock(torch.nn.Module):
        """A dense mixing layer (standing in for attention), then a routed mixture of experts."""

        def __init__(self) -> None:
            super().__init__()
            self.mix = torch.nn.Linear(WIDTH, WIDTH)
            self.router = torch.nn.Linear(WIDTH, EXPERTS, bias=False)
            self.experts = StackedExperts()

        def forward(self, x):
            x = x + torch.tanh(self.mix(x))
            flat = x.reshape(-1, WIDTH)
            weights, index = torch.topk(torch.softmax(self.router(flat), dim=-1), TOP_K, dim=-1)
            return x + self.experts(flat, index, weights).reshape(x.shape)

    class MoENet(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = torch.nn.ModuleList(MoEBlock() for _ in range(DEPTH))
            self.head = torch.nn.Linear(WIDTH, WIDTH)

        def forward(self, x):
            for block in self.blocks:
                x = block(x)
            return self.head(x)

    torch.manual_seed(0)
    return MoENet()


def _data(steps: int):
    """``steps`` + 1 batches per process (the first one untimed) for 2 processes."""
    import torch

    generator = torch.Generator().manual_seed(0)
    n = BATCH * (steps + 1) * 2
    return torch.utils.data.TensorDataset(
        torch.randn(n, TOKENS, WIDTH, generator=generator), torch.randn(n, TOKENS, WIDTH, generator=generator)
    )


def _local(tensor):
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _held_bytes(model, optimizer) -> dict:
    """Bytes held by parameters, gradients and AdamW state: the total over distinct local storages (as
    ``fsdp_memory.py`` counts), and each part split into experts and the rest by its local tensors' own
    bytes (FSDP2 reduces a block's gradients into one buffer, so a storage can hold both kinds)."""
    import torch

    named = list(model.named_parameters())
    kinds = {"experts": [p for n, p in named if ".experts." in f".{n}."]}
    kinds["rest"] = [p for n, p in named if ".experts." not in f".{n}."]

    def tensors(params: list, part: str) -> list:
        if part == "params":
            found = params
        elif part == "grads":
            found = [p.grad for p in params if p.grad is not None]
        else:
            found = [v for p in params for v in optimizer.state.get(p, {}).values()]
        return [_local(t) for t in found if isinstance(t, torch.Tensor)]

    seen: set = set()
    total = 0
    out: dict = {}
    for kind, params in kinds.items():
        out[kind] = {}
        for part in ("params", "grads", "optimizer"):
            found = tensors(params, part)
            out[kind][part] = sum(t.numel() * t.element_size() for t in found)
            for tensor in found:
                storage = tensor.untyped_storage()
                key = (storage.data_ptr(), storage.nbytes())
                if storage.nbytes() and key not in seen:
                    seen.add(key)
                    total += storage.nbytes()
        out[kind]["total"] = sum(out[kind].values())
    out["storages"] = total
    return out


def _timed_loop(model, optimizer, loader, backward) -> tuple[float, dict, float]:
    """One untimed step (held bytes counted after it), then the remaining steps timed between barriers;
    returns the seconds, the held bytes and the last step's loss averaged over the processes."""
    import torch
    import torch.distributed as dist

    held: dict = {}
    start = 0.0
    loss = torch.zeros(())
    for index, (x, y) in enumerate(loader):
        loss = torch.nn.functional.mse_loss(model(x), y)
        backward(loss)
        optimizer.step()
        if index == 0:
            held = _held_bytes(model, getattr(optimizer, "optimizer", optimizer))
        optimizer.zero_grad()
        if index == 0:
            dist.barrier()
            start = time.perf_counter()
    dist.barrier()
    seconds = time.perf_counter() - start
    last = loss.detach().clone()
    dist.all_reduce(last)
    return seconds, held, last.item() / dist.get_world_size()


def _by_hand(steps: int) -> tuple[float, dict]:
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("dp_shard",))
    model = _model()
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    dataset = _data(steps)
    sampler = torch.utils.data.distributed.DistributedSampler(
        dataset, num_replicas=2, rank=mesh.get_local_rank(), shuffle=False
    )
    loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, sampler=sampler)
    return _timed_loop(model, optimizer, loader, lambda loss: loss.backward())


def _prepared(steps: int, sizes: dict) -> tuple[float, dict]:
    import torch

    from accel_state.state import AcceleratorState, GradientState
    from accel_train import Accelerator, ParallelismConfig

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    accelerator = Accelerator(cpu=True, parallelism_config=ParallelismConfig(**sizes))
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    loader = torch.utils.data.DataLoader(_data(steps), batch_size=BATCH)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    return _timed_loop(model, optimizer, loader, accelerator.backward)


def worker(steps: int, repeats: int) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    runs = {
        "ep": lambda: _prepared(steps, {"ep_size": 2}),
        "dp": lambda: _prepared(steps, {"dp_shard_size": 2}),
        "hand": lambda: _by_hand(steps),
    }
    times: dict = {name: [] for name in runs}
    held: dict = {}
    losses: dict = {}
    for _ in range(repeats):
        for name, run in runs.items():
            seconds, held[name], losses[name] = run()
            times[name].append(seconds)
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, held)
    if dist.get_rank() == 0:
        seconds = {name: min(values) for name, values in times.items()}
        print(json.dumps({"seconds": seconds, "held": everyone, "losses": losses}))
    dist.destroy_process_group()


def _traffic_bytes() -> dict:
    """From the shapes (float32), per expert layer and process: the bytes of one block's experts and of
    the rest FSDP2 all-gathers at once, and the bytes of the routed (token, choice) rows ep sends out."""
    return {
        "experts": 2 * EXPERTS * HIDDEN * WIDTH * 4,
        "rest": (WIDTH * WIDTH + WIDTH + EXPERTS * WIDTH) * 4,
        "rows": BATCH * TOKENS * TOP_K * WIDTH * 4,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=10, help="timed steps per loop (after one untimed step)")
    parser.add_argument("--repeats", type=int, default=3, help="times each loop runs; the best time is kept")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.steps, args.repeats)
        return
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(port)]
    command += [__file__, "--worker", "--steps", str(args.steps), "--repeats", str(args.repeats)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "true"}
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1800, check=False)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{result.stderr[-4000:]}")
    data = json.loads([line for line in result.stdout.splitlines() if line.startswith("{")][-1])
    rate = {name: args.steps / seconds for name, seconds in data["seconds"].items()}
    mib = 1024 * 1024
    print(
        f"2 CPU processes (gloo), {DEPTH} MoE blocks: {EXPERTS} experts {WIDTH}->{HIDDEN}->{WIDTH}, top-{TOP_K}, "
        f"batch {BATCH} x [{TOKENS}, {WIDTH}] per process, AdamW, best of {args.repeats} x {args.steps} steps"
    )
    print(f"ep_size=2, prepared by the Accelerator:       {rate['ep']:8.2f} steps/s")
    print(f"dp_shard_size=2 (FSDP2), prepared:            {rate['dp']:8.2f} steps/s")
    print(f"dp_shard=2 by hand (fully_shard blocks, root): {rate['hand']:7.2f} steps/s")
    print(f"ratio ep / dp prepared:      {rate['ep'] / rate['dp']:.3f}   no goal (expert bytes gathered vs rows sent)")
    print(f"ratio dp prepared / by hand: {rate['dp'] / rate['hand']:.3f}   goal >= 0.97")
    print("held after a step, per process (MiB): params + grads + AdamW state = part")
    for rank, held in enumerate(data["held"]):
        for name, label in (("ep", "ep_size=2"), ("dp", "dp_shard_size=2")):
            for part in ("experts", "rest"):
                b = held[name][part]
                print(
                    f"  rank {rank} {label:<15} {part:<7} {b['params'] / mib:7.2f} + {b['grads'] / mib:7.2f} + "
                    f"{b['optimizer'] / mib:7.2f} = {b['total'] / mib:7.2f}"
                )
        storages = ", ".join(f"{name} {held[name]['storages'] / mib:.2f}" for name in ("ep", "dp", "hand"))
        print(f"  rank {rank} distinct storages: {storages}")
    losses = ", ".join(f"{name} {value:.6f}" for name, value in data["losses"].items())
    print(f"last step's loss, mean over processes (the same computation): {losses}")
    traffic = {name: value / mib for name, value in _traffic_bytes().items()}
    print(
        f"per block, from the shapes: FSDP2 all-gathers {traffic['experts']:.2f} MiB of experts under dp (0 under ep) "
        f"and {traffic['rest']:.2f} MiB of the rest under both; ep sends {traffic['rows']:.2f} MiB of routed rows "
        "per process and all-to-all"
    )
    print("reference accelerate: not measured (its release has no expert parallelism)")


if __name__ == "__main__":
    main()
