"""Expert parallelism end to end: ``accel verify`` launches a script whose model has two mixture-of-experts
blocks with ``--use_parallelism_config --parallelism_config_ep_size 2`` through the real launcher (the
size reaches ``ParallelismConfig()`` in each process from the environment), then the same script under
plain data parallelism (DDP), and the two runs agree step by step: the expert-parallel layout trains the
same model."""

from __future__ import annotations

import json
import textwrap

from conftest import accel_command, run_command

SCRIPT = textwrap.dedent(
    """
    import json, os
    import torch
    from accel import Accelerator

    class Experts(torch.nn.Module):
        def __init__(self, num_experts=4, width=8, hidden=16):
            super().__init__()
            self.num_experts = num_experts
            self.up = torch.nn.Parameter(torch.randn(num_experts, hidden, width) * 0.3)
            self.down = torch.nn.Parameter(torch.randn(num_experts, width, hidden) * 0.3)
        def forward(self, hidden_states, top_k_index, top_k_weights):
            out = torch.zeros_like(hidden_states)
            for e in range(self.num_experts):
                token, choice = torch.where(top_k_index == e)
                h = torch.relu(hidden_states[token] @ self.up[e].T) @ self.down[e].T
                out.index_add_(0, token, h * top_k_weights[token, choice, None])
            return out

    class MoE(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.router = torch.nn.Linear(8, 4, bias=False)
            self.experts = Experts()
        def forward(self, x):
            weights, index = torch.topk(torch.softmax(self.router(x), dim=-1), 2, dim=-1)
            return x + self.experts(x, index, weights)

    accelerator = Accelerator()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), MoE(), MoE(), torch.nn.Linear(8, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(64, 4, generator=generator)
    data = torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True).sin())
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    # what the prepared model holds, written before training: accel verify ends a run after its steps
    config = accelerator.parallelism_config
    held = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel()
               for n, p in model.named_parameters() if "experts" in n)
    facts = {"ep_size": config.ep_size if config else 1, "ep_rank": accelerator.expert_parallel_rank, "held": held}
    with open(os.path.join(os.environ["FACTS_DIR"], f"{facts['ep_size']}-{accelerator.process_index}.json"), "w") as f:
        json.dump(facts, f)
    for x, y in loader:
        accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
        optimizer.step()
        optimizer.zero_grad()
    """
)


def test_ep2_trains_the_same_model_as_ddp(tmp_path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    facts = tmp_path / "facts"
    facts.mkdir()
    args = ["--num_processes", "2", "--use_parallelism_config", "--parallelism_config_ep_size", "2", "--steps", "3"]
    result = run_command(
        [*accel_command(), "verify", *args, str(script)],
        timeout=300,
        env={"TMPDIR": str(tmp_path), "FACTS_DIR": str(facts)},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "reference: ddp on 2 process(es)" in result.stdout
    assert result.stdout.strip().endswith("accel verify: the runs agree")
    expert_run = [json.loads((facts / f"2-{rank}.json").read_text()) for rank in (0, 1)]
    reference = [json.loads((facts / f"1-{rank}.json").read_text()) for rank in (0, 1)]
    assert [run["ep_rank"] for run in expert_run] == [0, 1]
    for run, dense in zip(expert_run, reference):  # each process held half of the experts, DDP all of them
        assert run["held"] * 2 == dense["held"] == 2 * 2 * (4 * 16 * 8)
