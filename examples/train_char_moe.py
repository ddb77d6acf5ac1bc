"""Train a small byte-level MoE language model once per recipe and compare the loss curves.

The corpus is the Python standard library's own source files (``sysconfig.get_paths()["stdlib"]``,
every ``*.py`` below it), so every machine has it; one file in ten (by a CRC of its relative
path) is held out. The model: byte embeddings, a few pre-norm transformer blocks whose attention,
norms and top-k router are plain torch (autograd) and whose expert MLPs are
``lowprec_moe.torch.GroupedMLP`` (SwiGLU); only the experts' recipe changes between runs, with
the same seed, initial weights and batches.

Writes into ``--out-dir``: ``results.json`` (configuration and loss curves), ``results.md`` (the
final train / held-out loss table) and ``loss.png`` (when matplotlib is installed; otherwise
render it later with ``--replot OUT_DIR/results.json``).

Usage::

    python examples/train_char_moe.py --device cuda                 # the four recipes, defaults
    python examples/train_char_moe.py --device cpu --steps 3 --tiny  # a smoke test (NumPy)
    python examples/train_char_moe.py --replot docs/train_char_moe/results.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sysconfig
import time
import zlib
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

import lowprec_moe as lpm
import lowprec_moe.torch as lpt

RECIPES = {
    "bf16": lpm.Recipe.bf16,
    "mxfp8": lpm.Recipe.mxfp8,
    "nvfp4": lpm.Recipe.nvfp4,
    "nvfp4_rowscaled": lambda: lpm.Recipe.nvfp4(row_scaled_activation=True),
    # ablations of the default NVFP4 recipe (not run unless named in --recipes)
    "nvfp4_no_sr": lambda: lpm.Recipe.nvfp4(stochastic_rounding=False),
    "nvfp4_no_rht": lambda: lpm.Recipe.nvfp4(rht=False),
    "nvfp4_no_rht_sr": lambda: lpm.Recipe.nvfp4(rht=False, stochastic_rounding=False),
}
DEFAULT_RECIPES = ("bf16", "mxfp8", "nvfp4", "nvfp4_rowscaled")
DEFAULT_OUT = Path(__file__).resolve().parent.parent / "docs" / "train_char_moe"
TINY = dict(d_model=64, layers=1, heads=2, experts=4, ffn=64, seq=32, batch=2, eval_batches=1,
            eval_every=2, max_corpus_mb=1.0)


# ============================================================================================
# data


def load_corpus(max_mb: float, held_out_every: int = 10) -> tuple[np.ndarray, np.ndarray, dict]:
    """Bytes of the standard library's ``*.py`` files: (train, held_out, info).

    Files are visited in sorted order; a file is held out when the CRC-32 of its path relative
    to the library root is divisible by ``held_out_every``. Loading stops after ``max_mb``
    megabytes of training text (the held-out share is read from the same files visited).
    """
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py")
                   if "site-packages" not in p.parts and "dist-packages" not in p.parts)
    train, held, n_train, n_held = [], [], 0, 0
    limit = int(max_mb * 2**20)
    for p in files:
        try:
            data = p.read_bytes()
        except OSError:
            continue
        if zlib.crc32(p.relative_to(root).as_posix().encode()) % held_out_every == 0:
            held.append(data)
            n_held += len(data)
        else:
            train.append(data)
            n_train += len(data)
        if n_train >= limit:
            break
    if not held or n_train < 2**16:
        raise RuntimeError(f"the standard library under {root} holds too little Python source")
    info = dict(root_files=len(files), train_bytes=n_train, held_out_bytes=n_held,
                python=sysconfig.get_python_version())
    return (np.frombuffer(b"".join(train), np.uint8), np.frombuffer(b"".join(held), np.uint8),
            info)


def batches(corpus: torch.Tensor, seq: int, batch: int, seed: int):
    """Endless (inputs, targets) int64 ``[batch, seq]`` windows at seeded random offsets."""
    gen = torch.Generator().manual_seed(seed)
    offsets = torch.arange(seq + 1, device=corpus.device)
    while True:
        starts = torch.randint(0, corpus.numel() - seq - 1, (batch, 1), generator=gen)
        window = corpus[starts.to(corpus.device) + offsets].long()
        yield window[:, :-1], window[:, 1:]


# ============================================================================================
# model


class MoE(torch.nn.Module):
    """Top-k router (torch) over ``GroupedMLP`` experts; returns (output, load-balance loss)."""

    def __init__(self, d: int, ffn: int, experts: int, top_k: int, recipe, device):
        super().__init__()
        self.k, self.e = top_k, experts
        self.router = torch.nn.Linear(d, experts, bias=False, device=device)
        self.experts = lpt.GroupedMLP(experts, d, ffn, bias=False, recipe=recipe, device=device)

    def forward(self, x):
        b, t, d = x.shape
        h = x.reshape(-1, d)
        probs = self.router(h).float().softmax(-1)                     # [T, E]
        top_p, top_e = probs.topk(self.k, dim=-1)
        top_p = top_p / top_p.sum(-1, keepdim=True)
        flat_e = top_e.reshape(-1)
        order = torch.argsort(flat_e, stable=True)                     # sort by expert
        token = order // self.k
        counts = torch.bincount(flat_e, minlength=self.e)
        y = self.experts(h[token].to(torch.bfloat16), counts, top_p.reshape(-1)[order])
        out = torch.zeros_like(h, dtype=torch.float32).index_add_(0, token, y.float())
        # Switch-style balance loss: experts' token share times their mean router probability
        balance = self.e * (counts.float() / flat_e.numel() * probs.mean(0)).sum()
        return out.reshape(b, t, d).to(x.dtype), balance


class Block(torch.nn.Module):
    def __init__(self, d, heads, ffn, experts, top_k, recipe, device):
        super().__init__()
        self.heads = heads
        self.norm1 = torch.nn.RMSNorm(d, device=device)
        self.qkv = torch.nn.Linear(d, 3 * d, bias=False, device=device)
        self.proj = torch.nn.Linear(d, d, bias=False, device=device)
        self.norm2 = torch.nn.RMSNorm(d, device=device)
        self.moe = MoE(d, ffn, experts, top_k, recipe, device)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                           v.transpose(1, 2), is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        m, balance = self.moe(self.norm2(x))
        return x + m, balance


class CharMoE(torch.nn.Module):
    def __init__(self, cfg, recipe, device):
        super().__init__()
        d = cfg.d_model
        self.embed = torch.nn.Embedding(256, d, device=device)
        self.pos = torch.nn.Parameter(torch.zeros(cfg.seq, d, device=device))
        self.blocks = torch.nn.ModuleList(
            Block(d, cfg.heads, cfg.ffn, cfg.experts, cfg.top_k, recipe, device)
            for _ in range(cfg.layers))
        self.norm = torch.nn.RMSNorm(d, device=device)
        self.head = torch.nn.Linear(d, 256, bias=False, device=device)

    def forward(self, idx, targets):
        x = self.embed(idx) + self.pos[: idx.shape[1]]
        balance = 0.0
        for blk in self.blocks:
            x, bl = blk(x)
            balance = balance + bl
        logits = self.head(self.norm(x)).float()
        loss = F.cross_entropy(logits.reshape(-1, 256), targets.reshape(-1))
        return loss, balance / len(self.blocks)


# ============================================================================================
# training


def lr_at(step: int, steps: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train_one(name: str, cfg, train_data, held_data, device) -> dict:
    torch.manual_seed(cfg.seed)
    model = CharMoE(cfg, RECIPES[name](), device)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.01)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda")
    train_it = batches(train_data, cfg.seq, cfg.batch, cfg.seed)

    def evaluate():
        model.eval()
        it, total = batches(held_data, cfg.seq, cfg.batch, cfg.seed + 1), 0.0
        with torch.no_grad(), autocast:
            for _ in range(cfg.eval_batches):
                total += float(model(*next(it))[0])
        model.train()
        return total / cfg.eval_batches

    run = dict(train_steps=[], train_loss=[], eval_steps=[], eval_loss=[])
    _sync(device)
    t0 = time.perf_counter()
    for step in range(cfg.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg.steps, cfg.lr, cfg.warmup)
        idx, tgt = next(train_it)
        with autocast:
            loss, balance = model(idx, tgt)
        opt.zero_grad(set_to_none=True)
        (loss + cfg.balance_coef * balance).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        run["train_steps"].append(step + 1)
        run["train_loss"].append(loss.item())
        if (step + 1) % cfg.eval_every == 0 or step + 1 == cfg.steps:
            run["eval_steps"].append(step + 1)
            run["eval_loss"].append(evaluate())
            print(f"  {name:>16s} step {step + 1:5d}  train {run['train_loss'][-1]:.4f}  "
                  f"held-out {run['eval_loss'][-1]:.4f}", flush=True)
    _sync(device)
    run["seconds"] = time.perf_counter() - t0
    tail = run["train_loss"][-max(1, cfg.steps // 10):]
    run["final_train"] = sum(tail) / len(tail)
    run["final_eval"] = run["eval_loss"][-1]
    run["recipe"] = repr(RECIPES[name]())
    return run


# ============================================================================================
# outputs


def table(results: dict) -> str:
    runs, cfg = results["runs"], results["config"]
    base = runs.get("bf16")
    lines = [
        f"Byte-level MoE LM, {cfg['layers']} blocks, d_model {cfg['d_model']}, "
        f"{cfg['experts']} experts top-{cfg['top_k']} (SwiGLU, F = {cfg['ffn']}), "
        f"{cfg['batch']} x {cfg['seq']} bytes per step, {cfg['steps']} steps, seed {cfg['seed']}, "
        f"{results['device']}. Train loss: mean of the last {max(1, cfg['steps'] // 10)} steps; "
        f"held-out: {cfg['eval_batches']} fixed batches of held-out files.",
        "",
        "| recipe | final train loss | held-out loss | held-out gap to bf16 | time (s) |",
        "|---|---|---|---|---|",
    ]
    for name, r in runs.items():
        gap = ("-" if base is None or name == "bf16"
               else f"{100 * (r['final_eval'] - base['final_eval']) / base['final_eval']:+.2f} %")
        lines.append(f"| {name} | {r['final_train']:.4f} | {r['final_eval']:.4f} | {gap} | "
                     f"{r['seconds']:.1f} |")
    return "\n".join(lines) + "\n"


def write_outputs(results: dict, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    (out_dir / "results.md").write_text(table(results))
    print(table(results))
    try:
        from lowprec_moe.plot import plot_loss_curves
        cfg = results["config"]
        plot_loss_curves(results["runs"], out_dir / "loss.png",
                         title=f"byte-level MoE LM on the Python stdlib ({cfg['steps']} steps, "
                               f"{results['device']})")
        print(f"wrote {out_dir / 'loss.png'}")
    except ModuleNotFoundError as exc:
        print(f"no loss.png ({exc}); render it later with --replot {out_dir / 'results.json'}")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
    ap.add_argument("--recipes", default=",".join(DEFAULT_RECIPES),
                    help=f"comma-separated subset of {', '.join(RECIPES)}")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--out-dir", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--replot", type=Path, metavar="RESULTS_JSON",
                    help="only rewrite results.md and loss.png from a saved results.json")
    ap.add_argument("--tiny", action="store_true",
                    help="small model and batch for a CPU smoke test (overrides sizes)")
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--ffn", type=int, default=512, help="expert hidden size F (fc1 has 2F)")
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--balance-coef", type=float, default=0.01)
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--eval-batches", type=int, default=8)
    ap.add_argument("--max-corpus-mb", type=float, default=32.0)
    ap.add_argument("--seed", type=int, default=0)
    cfg = ap.parse_args(argv)
    if cfg.tiny:
        for k, v in TINY.items():
            setattr(cfg, k, v)
    unknown = [r for r in cfg.recipes.split(",") if r not in RECIPES]
    if unknown:
        ap.error(f"unknown recipes {unknown}; choose from {list(RECIPES)}")
    if cfg.d_model % cfg.heads:
        ap.error(f"--d-model {cfg.d_model} must be a multiple of --heads {cfg.heads}")
    for flag, v in (("--d-model", cfg.d_model), ("--ffn", cfg.ffn)):
        if v % 32:
            ap.error(f"{flag} {v} must be a multiple of 32 (MXFP8 / NVFP4 blocks)")
    return cfg


def main(argv=None) -> None:
    cfg = parse_args(argv)
    if cfg.replot is not None:
        results = json.loads(cfg.replot.read_text())
        out_dir = cfg.out_dir if cfg.out_dir != DEFAULT_OUT else cfg.replot.parent
        write_outputs(results, out_dir)
        return
    device = torch.device(cfg.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device (use --device cpu)")
    train_np, held_np, info = load_corpus(cfg.max_corpus_mb)
    print(f"corpus: {info['train_bytes'] / 2**20:.1f} MiB train, "
          f"{info['held_out_bytes'] / 2**20:.1f} MiB held out (Python {info['python']} stdlib)")
    train_data = torch.from_numpy(train_np.copy()).to(device)
    held_data = torch.from_numpy(held_np.copy()).to(device)
    dev_name = (torch.cuda.get_device_name(device) if device.type == "cuda"
                else f"CPU ({os.cpu_count()} threads, NumPy backend)")
    config = {k: v for k, v in vars(cfg).items() if k not in ("out_dir", "replot")}
    config["recipes"] = cfg.recipes.split(",")
    results = dict(config=config, corpus=info, device=dev_name, runs={})
    for name in config["recipes"]:
        print(f"recipe {name}: {RECIPES[name]()!r}", flush=True)
        results["runs"][name] = train_one(name, cfg, train_data, held_data, device)
    write_outputs(results, cfg.out_dir)
    base = results["runs"].get("bf16")
    if base is not None:
        for name, r in results["runs"].items():
            gap = (r["final_eval"] - base["final_eval"]) / base["final_eval"]
            if abs(gap) > 0.02:
                print(f"finding: {name} held-out loss is {100 * gap:+.2f} % from bf16 "
                      "(over the 2 % line)")


if __name__ == "__main__":
    main()
