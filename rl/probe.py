"""`python -m cudal2_rl.probe`: what a policy would choose at each shape of the reward table,
teacher-forced (nothing is sampled, nothing is built).

Per shape, the candidates are the kernel files the policy could write there:
- the table's entries at the shape that a policy can write today: the source names a config
  (its `// config:` banner) and today's instantiation of it is the measured text, so that
  config's family file (cudal2_rl.corpus.family_file) builds the binary the table measured
  (`reachable_config`; entries of templates changed since their measurement are left out);
- `candidates` family configs drawn once (seeded) from the spaces of the arch's families,
  round-robin over families, the same set at every shape, so differences between shapes are the
  policy's, and drawn without regard to the shape, so a tile the family's guard refuses there
  can be chosen (and is counted);
- with `corpus` > 0, that many complete files of the small corpus templates (the form the
  default policy was warm-started on), also the same set at every shape.

A candidate's score is the sum of the log-probabilities of its tokens and the end token given
the prompt (the policy's chat template and prompt style, as rl/train.py builds prompts; the
prompt is run once per shape and its cache reused); the softmax over the candidates gives the
policy's choice among them. Reported per shape: p and rank of the measured best among the
entries a policy can write (and whether it is the table's fastest binary there), the expected tile (probability-weighted BM, BN), the probability
of a candidate whose family's guard refuses the shape (`Family.serves`: accepts() and, for a
tile-only family, tile multiples), and the policy's top candidate.
"""
from __future__ import annotations

import argparse
import csv
import math
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .corpus import FAMILY_PREFIX, SMALL_TEMPLATES, Variant, family_file, family_kinds, variants

CSV_FIELDS = ("M", "N", "K", "candidates", "table_configs", "best", "best_is_fastest", "p_best", "rank_best",
              "exp_BM", "exp_BN", "p_refused", "p_corpus", "top", "p_top")


@dataclass(frozen=True)
class Candidate:
    variant: Variant
    text: str            # the completion (kernel file) scored
    origin: str          # "table" | "family" | "corpus"

    def tile(self) -> tuple[int, int]:
        if self.variant.family is not None:
            c = self.variant.config()
            if c.get("BM") is None:   # gemv: no BM x BN knob; its meta's tile is [MAX_M, BN, 8]
                from cudal2.templates.gemv import gemv_tile_cols
                return int(c.get("MAX_M")), gemv_tile_cols(c.as_dict())
            return int(c.get("BM")), int(c.get("BN"))
        t = self.variant.meta()["tile"]
        return int(t[0]), int(t[1])


# -- candidates -----------------------------------------------------------------------------
def reachable_config(source: str, arch: str):
    """The config whose instantiation a measured source is, byte for byte, today
    (cudal2.templates.config_of), when its family takes it on `arch`: its family file builds the
    binary the table measured, so a policy can write it. None when the template changed since,
    or the source is not an instantiation."""
    from cudal2.templates import FAMILIES, config_of
    cfg = config_of(source)
    return cfg if cfg is not None and FAMILIES[cfg.family].valid(cfg, arch) else None


def _family_variant(cfg, arch: str) -> Variant:
    return Variant(FAMILY_PREFIX + cfg.family, cfg.params, str(cfg.get("ACC", "f32")),
                   str(cfg.get("LAYOUT", "RR")), arch)


def fixed_candidates(arch: str, acc: str, *, n: int = 32, corpus: int = 0, seed: int = 0) -> list[Candidate]:
    """`n` family configs round-robin over the arch's families (the target's accumulator, layout
    RR) and `corpus` small-template corpus files, drawn with `seed`."""
    rng = random.Random(seed)
    pools = [[v for v in variants(k, arch) if v.acc == acc and v.layout == "RR"] for k in family_kinds(arch)]
    pools = [rng.sample(p, len(p)) for p in pools if p]
    picked = [pools[i % len(pools)][i // len(pools)] for i in range(n)
              if pools and i // len(pools) < len(pools[i % len(pools)])]
    out = [Candidate(v, v.source(), "family") for v in picked]
    small = [v for t in SMALL_TEMPLATES for v in variants(t, arch) if v.acc == acc and v.layout == "RR"]
    out += [Candidate(v, v.source(), "corpus") for v in rng.sample(small, min(corpus, len(small)))]
    return out


def table_candidates(table, shape, arch: str) -> tuple[list[Candidate], Candidate | None]:
    """(the family files of the table's entries at `shape` a policy can write today
    (reachable_config), fastest first; the first of them, the shape's measured best among what a
    policy can write, or None when there is none)."""
    out = []
    for e in table.entries(shape):
        cfg = reachable_config(e.source, arch)
        if cfg is not None:
            out.append(Candidate(_family_variant(cfg, arch), family_file(cfg), "table"))
    return out, (out[0] if out else None)


def best_is_fastest(table, shape, arch: str) -> bool:
    """Whether the table's fastest binary at `shape` is one a policy can write today."""
    entries = table.entries(shape)
    return bool(entries) and reachable_config(entries[0].source, arch) is not None


def _dedup(cands: list[Candidate]) -> list[Candidate]:
    seen, out = set(), []
    for c in cands:
        if c.text not in seen:
            seen.add(c.text)
            out.append(c)
    return out


# -- scoring --------------------------------------------------------------------------------
def prompt_ids(tok, prompt: str) -> list[int]:
    enc = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                  tokenize=True, return_dict=True)
    return list(enc["input_ids"])


def completion_ids(tok, text: str) -> list[int]:
    return list(tok(text + tok.eos_token, add_special_tokens=False)["input_ids"])


def score(model, tok, prompt: str, texts: list[str], *, batch: int = 16) -> list[float]:
    """Sum of token log-probs of each text (and the end token) after the prompt; the prompt runs
    once and its cache is repeated across each batch of completions."""
    import torch
    p = torch.tensor([prompt_ids(tok, prompt)])
    with torch.no_grad():
        out = model(input_ids=p, use_cache=True)
    first = torch.log_softmax(out.logits[0, -1].float(), -1)
    ids = [completion_ids(tok, t) for t in texts]
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))     # batches of like lengths: little padding
    scores = [0.0] * len(ids)
    for i in range(0, len(order), batch):
        chunk = order[i:i + batch]
        for j, s in zip(chunk, _score_batch(model, out.past_key_values, first, [ids[j] for j in chunk], p.shape[1])):
            scores[j] = s
    return scores


def _score_batch(model, cache, first, ids, plen: int) -> list[float]:
    """The batch's scores: right-padded completions after a copy of the prompt's cache."""
    import copy
    import torch
    n, width = len(ids), max(len(x) for x in ids)
    pad = 0
    x = torch.tensor([row + [pad] * (width - len(row)) for row in ids])
    mask = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in ids])
    kv = copy.deepcopy(cache)
    kv.batch_repeat_interleave(n)
    with torch.no_grad():
        logits = model(input_ids=x, attention_mask=torch.cat([torch.ones(n, plen, dtype=mask.dtype), mask], 1),
                       past_key_values=kv, use_cache=True).logits.float()
    logp = torch.log_softmax(logits[:, :-1], -1).gather(-1, x[:, 1:, None])[..., 0] * mask[:, 1:]
    return [float(first[row[0]] + logp[j].sum()) for j, row in enumerate(ids)]


def softmax(xs: list[float]) -> list[float]:
    top = max(xs)
    e = [math.exp(x - top) for x in xs]
    s = sum(e)
    return [v / s for v in e]


# -- the probe ------------------------------------------------------------------------------
def probe_shape(model, tok, shape, table, fixed: list[Candidate], *, arch: str, style: str,
                acc: str = "f32") -> dict:
    """One shape's row (CSV_FIELDS)."""
    from .prompts import make_prompt
    listed, best = table_candidates(table, shape, arch)
    cands = _dedup(listed + fixed)
    probs = softmax(score(model, tok, make_prompt(style, shape, arch, acc), [c.text for c in cands]))
    order = sorted(range(len(cands)), key=lambda i: -probs[i])
    top = order[0]
    b = next((i for i, c in enumerate(cands) if best is not None and c.text == best.text), None)
    M, N, K = shape
    return {"M": M, "N": N, "K": K, "candidates": len(cands), "table_configs": len(listed),
            "best": best.variant.config().label() if best else "",
            "best_is_fastest": best_is_fastest(table, shape, arch),
            "p_best": probs[b] if b is not None else None,
            "rank_best": order.index(b) + 1 if b is not None else None,
            "exp_BM": sum(p * c.tile()[0] for p, c in zip(probs, cands)),
            "exp_BN": sum(p * c.tile()[1] for p, c in zip(probs, cands)),
            "p_refused": float(sum(p for p, c in zip(probs, cands) if not c.variant.serves(M, N, K))),
            "p_corpus": float(sum(p for p, c in zip(probs, cands) if c.origin == "corpus")),
            "top": _label(cands[top]), "p_top": probs[top]}


def _label(c: Candidate) -> str:
    return c.variant.config().label() if c.variant.family is not None else c.variant.label()


def probe_policy(model, tokenizer, shapes, table, *, arch: str, style: str, candidates: int = 32,
                 corpus: int = 0, acc: str = "f32", seed: int = 0, log=None) -> list[dict]:
    """One row per shape (CSV_FIELDS); `log(line)` is called with each row's line."""
    model.eval()
    fixed = fixed_candidates(arch, acc, n=candidates, corpus=corpus, seed=seed)
    rows = []
    for shape in shapes:
        rows.append(probe_shape(model, tokenizer, tuple(shape), table, fixed, arch=arch, style=style, acc=acc))
        if log:
            log(line(rows[-1]))
    return rows


def line(r: dict) -> str:
    best = (f"p(best) {r['p_best']:.3f} rank {r['rank_best']}/{r['candidates']}" if r["p_best"] is not None
            else f"no table entry a policy can write (of {r['candidates']})")
    return (f"{r['M']}x{r['N']}x{r['K']}: {best}; expected tile {r['exp_BM']:.0f}x{r['exp_BN']:.0f}; "
            f"p(refused) {r['p_refused']:.2f}; p(corpus) {r['p_corpus']:.2f}; "
            f"top {r['top']} ({r['p_top']:.2f}); table configs {r['table_configs']}")


def write_csv(rows: list[dict], path: Path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.4f}" if isinstance(v, float) else ("" if v is None else v)) for k, v in r.items()})


# -- shapes ---------------------------------------------------------------------------------
def spread_shapes(shapes, n: int) -> list[tuple]:
    """n shapes spread over (log2 M, log2 N): farthest-point picks, from the smallest M*N."""
    pool = sorted({tuple(s) for s in shapes}, key=lambda s: (s[0] * s[1], s))
    if not pool:
        return []
    picked = [pool[0]]

    def dist(s):
        return min(abs(math.log2(s[0] / t[0])) + abs(math.log2(s[1] / t[1])) for t in picked)
    while len(picked) < min(n, len(pool)):
        picked.append(max((s for s in pool if s not in picked), key=lambda s: (dist(s), s)))
    return sorted(picked)


def sample_shapes(table, n: int, arch: str) -> list[tuple]:
    """n table shapes spread over M and N, among those with an entry a policy can write when
    there are enough of them."""
    named = [s for s in table.shapes() if table_candidates(table, s, arch)[1] is not None]
    return spread_shapes(named if len(named) >= n else table.shapes(), n)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m cudal2_rl.probe", description=__doc__.split("\n\n")[0])
    ap.add_argument("--policy", default="smollm2", help="smollm2 | builtin | a local model folder")
    ap.add_argument("--table", nargs="*", default=None, help="results DBs (default: the committed ones)")
    ap.add_argument("--gpu", default=None, help="the table's GPU model (default: the one with most rows)")
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("--acc", default="f32")
    ap.add_argument("--style", default=None, help="prompt style (default: the policy's)")
    group = ap.add_mutually_exclusive_group()
    group.add_argument("--shapes", default=None, help="CSV with an M,N,K header (table shapes)")
    group.add_argument("--sample", type=int, default=8, help="table shapes spread over M and N")
    ap.add_argument("--candidates", type=int, default=32, help="family configs scored at every shape")
    ap.add_argument("--corpus", type=int, default=0, help="small corpus files scored at every shape "
                    "(~1.5k tokens each: slow on a CPU)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--out", default="", help="folder for probe.csv")
    args = ap.parse_args(argv)
    return run(args)


def run(args) -> int:
    import torch
    from .policy import default_style, load_policy
    from .table import RewardTable
    if args.threads:
        torch.set_num_threads(args.threads)
    table = RewardTable.open(args.table, gpu=args.gpu, arch=args.arch, layout="RR", acc=args.acc)
    if not table.shapes():
        raise SystemExit(f"probe: the reward table ({', '.join(map(str, table.paths))}) holds no {args.arch} shape")
    from cudal2.search.tune import read_shapes
    shapes = ([(s.M, s.N, s.K) for s in read_shapes(args.shapes)] if args.shapes
              else sample_shapes(table, args.sample, args.arch))
    missing = [s for s in shapes if s not in table.shapes()]
    if missing:
        raise SystemExit(f"probe: shapes not in the table: {missing[:4]}")
    print(f"table: {table.describe().splitlines()[0]}")
    t0 = time.time()
    model, tok = load_policy(args.policy, log=lambda *a: None)
    rows = probe_policy(model, tok, shapes, table, arch=args.arch, style=args.style or default_style(args.policy),
                        candidates=args.candidates, corpus=args.corpus, acc=args.acc, seed=args.seed, log=print)
    print(f"{len(rows)} shapes in {time.time() - t0:.0f} s (policy {args.policy})")
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        write_csv(rows, Path(args.out) / "probe.csv")
        print(f"wrote {Path(args.out) / 'probe.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
