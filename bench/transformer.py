"""The char GPT as a job against the same model hand-written in plain PyTorch (nanoGPT's way).

examples/char_gpt.yaml (token and learned position embeddings, pre-norm blocks of causal
attention and a GELU MLP with residual adds, a final layer norm, a per-step head; Adam with
warm-up, a cosine schedule and gradient clipping) trains through `Trainer.run()`; the
hand-written model starts from the job's initial parameters (so from the same seed) and trains
on the same training split with the same batch size, optimiser, schedule, clipping and number
of steps, each drawing its batches in its own seeded order. They alternate in blocks of steps
inside one run, on one torch thread: every `--block` steps of the job a callback runs the same
number of steps of the plain loop, so other work on the machine falls on both alike (as
bench/overhead.py). At the end both are evaluated on the test split. Targets: the job's test
loss within 3% of the hand-written one's, and its training samples/s >= 0.95 of the loop's.

    .venv/bin/python bench/transformer.py [--steps 300] [--block 5]
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
from pathlib import Path

import smoke  # bench/smoke.py: run as a script, bench/ is on sys.path
import torch
import torch.nn.functional as F
import yaml
from torch import nn

from dsl.compiler import compile_job
from dsl.net import NeuralNet
from workers.data import TrainingData
from workers.trainer import Trainer, TrainOptions
from workers.updaters import kernel_options

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "char_gpt.yaml"


class CausalSelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.c_attn = nn.Linear(dim, 3 * dim)
        self.c_proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, steps, dim = x.shape
        q, k, v = self.c_attn(x).split(dim, dim=2)
        q, k, v = (t.view(batch, steps, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(batch, steps, dim))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, hidden: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(dim)
        self.attn = CausalSelfAttention(dim, heads)
        self.ln_2 = nn.LayerNorm(dim)
        self.c_fc = nn.Linear(dim, hidden)
        self.c_proj = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.c_proj(F.gelu(self.c_fc(self.ln_2(x))))


class GPT(nn.Module):
    def __init__(
        self, vocab: int, steps: int, dim: int, heads: int, hidden: int, layers: int
    ) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(steps, dim)
        self.h = nn.ModuleList(Block(dim, heads, hidden) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(positions)
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))

    @torch.no_grad()
    def copy_from(self, net: NeuralNet, blocks: int) -> None:
        """The job's initial parameters, by their names in the job."""
        p = net.named_params()
        pairs = [
            (self.wte.weight, "tok/w"),
            (self.wpe.weight, "pos/w"),
            (self.ln_f.weight, "lnf/w"),
            (self.ln_f.bias, "lnf/b"),
            (self.lm_head.weight, "head/w"),
            (self.lm_head.bias, "head/b"),
        ]
        for i, block in enumerate(self.h[:blocks]):
            assert isinstance(block, Block)
            name = f"block.{i}"
            pairs += [
                (block.ln_1.weight, f"{name}.ln1/w"),
                (block.ln_1.bias, f"{name}.ln1/b"),
                (block.attn.c_attn.weight, f"{name}.att/w_qkv"),
                (block.attn.c_attn.bias, f"{name}.att/b_qkv"),
                (block.attn.c_proj.weight, f"{name}.att/w_out"),
                (block.attn.c_proj.bias, f"{name}.att/b_out"),
                (block.ln_2.weight, f"{name}.ln2/w"),
                (block.ln_2.bias, f"{name}.ln2/b"),
                (block.c_fc.weight, f"{name}.fc/w"),
                (block.c_fc.bias, f"{name}.fc/b"),
                (block.c_proj.weight, f"{name}.proj/w"),
                (block.c_proj.bias, f"{name}.proj/b"),
            ]
        assert {name for _, name in pairs} == set(p), "the job's net is not this GPT"
        for mine, name in pairs:
            mine.copy_(p[name])


def lr_at(step: int, total: int, base: float, final: float, warmup: int) -> float:
    """Cosine from base to final over the run, times a linear warm-up (the job's schedule)."""
    lr = final + 0.5 * (base - final) * (1 + math.cos(math.pi * min(step, total) / total))
    return lr * (step + 1) / warmup if step < warmup else lr


class PlainLoop:
    """The loop a person would write by hand for the same model, data and optimiser."""

    def __init__(self, model: GPT, x: torch.Tensor, y: torch.Tensor, job: dict, steps: int):
        self.model, self.x, self.y = model, x, y
        self.batch = job["data"]["batch_size"]
        updater = job["updater"]
        self.lr = updater["lr"]
        self.clip = updater["clip"]["grad_norm"]
        self.total = steps
        params = list(model.parameters())
        # The trainer's kernels (foreach; fused on CUDA): the same update work on both sides.
        kernel = kernel_options("adam", params)
        self.opt = torch.optim.Adam(params, lr=self.lr["base"], **kernel)
        self.gen = torch.Generator().manual_seed(1)
        self.perm = torch.randperm(len(x), generator=self.gen)
        self.pos = self.step = 0

    def steps(self, count: int) -> None:
        for _ in range(count):
            if self.pos + self.batch > len(self.x):
                self.perm, self.pos = torch.randperm(len(self.x), generator=self.gen), 0
            idx = self.perm[self.pos : self.pos + self.batch]
            self.pos += self.batch
            lr = lr_at(
                self.step,
                self.total,
                self.lr["base"],
                self.lr["final"],
                self.lr["warmup_steps"],
            )
            for group in self.opt.param_groups:
                group["lr"] = lr
            self.opt.zero_grad(set_to_none=True)
            loss = self.model(self.x[idx], self.y[idx])
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
            self.opt.step()
            self.step += 1

    @torch.no_grad()
    def test_loss(self, x: torch.Tensor, y: torch.Tensor) -> float:
        self.model.eval()
        losses = [
            self.model(x[i : i + self.batch], y[i : i + self.batch]).item()
            * len(x[i : i + self.batch])
            for i in range(0, len(x), self.batch)
        ]
        return sum(losses) / len(x)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--block", type=int, default=5)
    parser.add_argument("--device", default="cpu", help="cpu or cuda (bench/gpu_check.sh)")
    args = smoke.parse(parser, steps=10, block=5)
    torch.set_num_threads(1)
    job = yaml.safe_load(EXAMPLE.read_text())
    # The whole test split at the end, nothing evaluated on the way (not timed either way).
    job |= {"train_steps": args.steps, "validate": {"freq": 0, "steps": 1}}
    job["test"] = {"freq": 0, "steps": 0}
    job["checkpoint"] = {"freq": 0, "keep": 1}
    with tempfile.TemporaryDirectory() as tmp:
        loaded = TrainingData(cache_dir=Path(tmp))
        compiled = compile_job(job, loaded)
        data = loaded.dataset
        block = next(layer for layer in job["neuralnet"]["layers"] if layer["type"] == "repeat")
        inner = {layer["name"]: layer for layer in block["layers"]}
        vocab = data.info.num_classes
        assert vocab is not None
        steps = data.x_train.shape[1]
        dim, heads = inner["proj"]["units"], inner["att"]["heads"]
        model = GPT(vocab, steps, dim, heads, inner["fc"]["units"], block["times"])
        model.copy_from(compiled.net, block["times"])
        model.to(args.device)
        x_train, y_train = data.x_train.to(args.device), data.y_train.to(args.device)
        plain = PlainLoop(model, x_train, y_train, job, args.steps)
        options = TrainOptions(run_dir=Path(tmp) / "run", device=args.device)
        trainer = Trainer(compiled, data, options)
        sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
        ours: list[float] = []
        theirs: list[float] = []
        mark = time.perf_counter()

        def alternate(step: int) -> None:
            nonlocal mark
            if step % args.block:
                return
            sync()
            now = time.perf_counter()
            ours.append(now - mark)
            plain.steps(args.block)
            sync()
            theirs.append(time.perf_counter() - now)
            mark = time.perf_counter()

        summary = trainer.run(on_step=alternate)
        plain.steps(args.steps - plain.step)  # the steps after the last whole block
        job_loss = summary.metrics["test/loss"]
        plain_loss = plain.test_loss(data.x_test.to(args.device), data.y_test.to(args.device))
    samples = args.block * job["data"]["batch_size"]
    blocks = len(ours) - 1  # the first block warms up
    total_ours, total_theirs = sum(ours[1:]), sum(theirs[1:])
    print(f"steps: {args.steps}, batch {job['data']['batch_size']}, blocks of {args.block}")
    print(f"job   {samples * blocks / total_ours:8.0f} samples/s   test loss {job_loss:.4f}")
    print(f"plain {samples * blocks / total_theirs:8.0f} samples/s   test loss {plain_loss:.4f}")
    print(f"samples/s job/plain: {total_theirs / total_ours:.3f} (target >= 0.95)")
    print(f"test loss job/plain: {job_loss / plain_loss:.4f} (target within 3%)")


if __name__ == "__main__":
    main()
