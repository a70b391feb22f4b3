"""A model's linear layers as a shapes file (`cudal2 shapes --model PATH`).

Reads a Hugging Face config offline (a model folder or its config.json; nothing is downloaded:
the config's own JSON fields, under the spellings transformers' config class for its model_type
maps, never transformers' defaults, so a missing field is an error, not a guess) and writes one row per GEMM a forward pass runs on one tensor-parallel rank, at each token count:

    M,N,K,layout,weight,layer,model,tokens,count

`x @ W.t()`: M = tokens, N = output features, K = input features; the weight is (N, K) row-major,
so B is column-major: layout RC. The columns are those of shapes/llm_trace.csv (plus `count`), so
`cudal2 tune`, `cudal2 campaign prepare`, `cudal2 bench --weights` and
benchmarks/serving_trace.py read the file as they read that one.

Layers (hd = head_dim, or hidden / heads when the config has none; kv = num_key_value_heads):
    qkv (fused, as serving engines run it)   N = (heads + 2 kv) hd      K = hidden
    q, k, v (separate, as transformers' modules)  N = heads hd, kv hd, kv hd
    o                                        N = hidden                K = heads hd
    gate_up (fused) or gate, up (separate)   N = 2 I (or I each)        K = hidden
    down                                     N = hidden                K = I
    router (mixture of experts)              N = experts               K = hidden
    expert_gate_up / expert_gate, expert_up, expert_down: as the MLP with I = moe_intermediate_size
        (Mixtral: intermediate_size), M = tokens each expert sees (below)
    shared_gate_up / ..., shared_down: the shared expert(s), M = tokens,
        I = shared_expert_intermediate_size (Qwen-MoE) or n_shared_experts x moe_intermediate_size
    lm_head                                  N = vocab                 K = hidden
Tensor parallelism as Megatron and vLLM shard (tp ranks): column-parallel layers (qkv, q, k, v,
gate/up, experts' gate/up, lm_head) divide N, row-parallel ones (o, down, experts' down) divide K;
heads, kv heads (when kv >= tp) and the intermediate sizes must divide by tp; with kv < tp every
rank holds one replicated kv head (tp must be a multiple of kv); lm_head gets ceil(vocab / tp)
rows; the router is replicated.

Tokens each expert sees: with T tokens, top-k routing over E experts and UNIFORM routing, the T*k
assignments spread evenly: each active expert sees M_e = ceil(T*k / E) tokens and
min(E, T*k) experts are active. Real routers are not uniform; this is the balanced case.

lm_head runs on every token (as transformers' forward does without logits_to_keep; serving
engines compute logits only for each sequence's last token, so their prefill lm_head M is the
sequence count).

weight: every token count (one forward pass) counts equally; inside one, a row's weight is its
share of the pass's GEMM FLOPs across the layer stack, 2*M*N*K*count / sum over the pass, where
count = how often the GEMM runs per pass (layers of its kind, x active experts for expert rows, 1
for lm_head). Weights sum to 1 over the file. For rows of one M, FLOPs and weight bytes (2*N*K)
are both proportional to N*K*count, so the share is the time share whether the layer is compute-
or bandwidth-bound; for expert rows (smaller M) it is the FLOP share only.
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

DEFAULT_TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
COLUMNS = ("M", "N", "K", "layout", "weight", "layer", "model", "tokens", "count")
# Standard name -> other spellings configs use (GPT-2 style). transformers' attribute_map, when
# it knows the model type, adds its own.
ALIASES = {
    "hidden_size": ("n_embd", "d_model"),
    "num_attention_heads": ("n_head",),
    "num_hidden_layers": ("n_layer",),
    "intermediate_size": ("n_inner", "ffn_dim"),
    "num_local_experts": ("num_experts", "n_routed_experts"),
}


class ConfigError(ValueError):
    """The config cannot be read: the message names the file and the missing or malformed field."""


@dataclass(frozen=True)
class Model:
    name: str
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    layers: int
    intermediate: int | None       # dense MLP (None: every layer is a mixture of experts)
    vocab: int
    experts: int = 0               # routed experts (0: dense model)
    top_k: int = 0
    expert_intermediate: int = 0
    shared_intermediate: int = 0   # all shared experts together (0: none)
    moe_layers: int = 0            # layers whose MLP is the mixture (the rest are dense)


# --- reading a config ---------------------------------------------------------------------------
def _config_path(path) -> Path:
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        raise ConfigError(f"{p}: no such config file (give a model folder or its config.json)")
    return p


def _transformers_aliases(model_type) -> dict[str, str]:
    """attribute_map of transformers' config class for this model_type (spellings of standard
    fields, e.g. GPT-2's n_embd), when transformers knows the type. The class is only looked up,
    never instantiated: its defaults would hide a missing field."""
    if not isinstance(model_type, str):
        return {}
    try:
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING
        return dict(getattr(CONFIG_MAPPING[model_type], "attribute_map", {}) or {})
    except (ImportError, KeyError):
        return {}


def read_config(path) -> Model:
    """A Model from a config.json (or a folder holding one). ConfigError names the bad field."""
    p = _config_path(path)
    try:
        raw = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{p}: cannot read: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{p}: not JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{p}: not a JSON object")
    if isinstance(raw.get("text_config"), dict):   # multimodal wrappers: the language model's
        raw = {**raw["text_config"], "model_type": raw["text_config"].get("model_type")}
    amap = _transformers_aliases(raw.get("model_type"))

    def get(name, default=None, *, required=False, allow_zero=False):
        names = (name, *ALIASES.get(name, ()), *([amap[name]] if name in amap else []),
                 *(k for k, v in amap.items() if v == name))
        for n in names:
            if n in raw and raw[n] is not None:
                v = raw[n]
                if isinstance(v, bool) or not isinstance(v, int) or v < (0 if allow_zero else 1):
                    raise ConfigError(f"{p}: field {n!r} must be a {'non-negative' if allow_zero else 'positive'} "
                                      f"integer, got {v!r}")
                return v
        if required:
            raise ConfigError(f"{p}: field {name!r} is missing")
        return default

    if raw.get("kv_lora_rank") or raw.get("q_lora_rank"):
        raise ConfigError(f"{p}: field 'kv_lora_rank': multi-head latent attention is not supported")
    hidden = get("hidden_size", required=True)
    heads = get("num_attention_heads", required=True)
    explicit_hd = get("head_dim")
    if explicit_hd is None and hidden % heads:
        raise ConfigError(f"{p}: field 'num_attention_heads' ({heads}) does not divide "
                          f"'hidden_size' ({hidden}) and there is no 'head_dim'")
    head_dim = explicit_hd or hidden // heads
    kv = get("num_key_value_heads", heads)
    if heads % kv:
        raise ConfigError(f"{p}: field 'num_key_value_heads' ({kv}) does not divide "
                          f"'num_attention_heads' ({heads})")
    layers = get("num_hidden_layers", required=True)
    vocab = get("vocab_size", required=True)
    experts = get("num_local_experts", 0, allow_zero=True)
    name = raw.get("_name_or_path") or p.parent.name or "model"
    name = Path(str(name)).name
    if not experts:
        return Model(name, hidden, heads, kv, head_dim, layers,
                     get("intermediate_size", required=True), vocab)
    top_k = get("num_experts_per_tok", required=True)
    if top_k > experts:
        raise ConfigError(f"{p}: field 'num_experts_per_tok' ({top_k}) exceeds the {experts} experts")
    moe_inter = get("moe_intermediate_size") or get("intermediate_size", required=True)
    shared = get("shared_expert_intermediate_size", 0, allow_zero=True) or (
        get("n_shared_experts", 0, allow_zero=True) * moe_inter)
    # Which layers are sparse: Qwen-MoE (decoder_sparse_step, mlp_only_layers), DeepSeek-style
    # (first_k_dense_replace); every layer otherwise (Mixtral).
    step = get("decoder_sparse_step", 1)
    dense_only = raw.get("mlp_only_layers") or []
    if not isinstance(dense_only, list) or not all(isinstance(i, int) for i in dense_only):
        raise ConfigError(f"{p}: field 'mlp_only_layers' must be a list of layer numbers")
    first_dense = get("first_k_dense_replace", 0, allow_zero=True)
    sparse = [i for i in range(layers)
              if i not in dense_only and (i + 1) % step == 0 and i >= first_dense]
    inter = get("intermediate_size", required=len(sparse) < layers)
    return Model(name, hidden, heads, kv, head_dim, layers, inter, vocab, experts, top_k,
                 moe_inter, shared, len(sparse))


# --- the rows -----------------------------------------------------------------------------------
def _shard(model: Model, tp: int) -> dict[str, int]:
    """Per-rank sizes under tensor parallelism tp; ConfigError names a field tp does not divide."""
    if tp < 1:
        raise ConfigError(f"tp must be >= 1, got {tp}")

    def div(value, field):
        if value % tp:
            raise ConfigError(f"{model.name}: field {field!r} ({value}) is not divisible by tp={tp}")
        return value // tp

    heads = div(model.heads, "num_attention_heads")
    if model.kv_heads >= tp:
        kv = div(model.kv_heads, "num_key_value_heads")
    elif tp % model.kv_heads:
        raise ConfigError(f"{model.name}: tp={tp} is not a multiple of field 'num_key_value_heads' "
                          f"({model.kv_heads}), so kv heads cannot be replicated evenly")
    else:
        kv = 1                                  # each rank holds a replica of one kv head
    out = {"heads": heads, "kv": kv, "vocab": -(-model.vocab // tp)}
    if model.intermediate and model.moe_layers < model.layers:
        out["inter"] = div(model.intermediate, "intermediate_size")
    if model.experts:
        out["expert_inter"] = div(model.expert_intermediate, "moe_intermediate_size")
        if model.shared_intermediate:
            out["shared_inter"] = div(model.shared_intermediate, "shared_expert_intermediate_size")
    return out


def _mlp(prefix: str, inter: int, hidden: int, fused: bool) -> list[tuple[str, int, int]]:
    up = [(f"{prefix}gate_up", 2 * inter, hidden)] if fused else [
        (f"{prefix}gate", inter, hidden), (f"{prefix}up", inter, hidden)]
    return up + [(f"{prefix}down", hidden, inter)]


def expert_tokens(tokens: int, top_k: int, experts: int) -> tuple[int, int]:
    """(tokens each active expert sees, active experts) under uniform routing."""
    assignments = tokens * top_k
    return -(-assignments // experts), min(experts, assignments)


def layer_gemms(model: Model, tokens: int, *, tp: int = 1, fused: bool = True
                ) -> list[tuple[str, int, int, int, int]]:
    """(layer, M, N, K, count per forward pass) of one rank at `tokens` tokens."""
    s = _shard(model, tp)
    h, hd = model.hidden, model.head_dim
    attn = ([("qkv", (s["heads"] + 2 * s["kv"]) * hd, h)] if fused else
            [("q", s["heads"] * hd, h), ("k", s["kv"] * hd, h), ("v", s["kv"] * hd, h)])
    attn.append(("o", h, s["heads"] * hd))
    out = [(name, tokens, n, k, model.layers) for name, n, k in attn]
    dense_layers = model.layers - model.moe_layers
    if dense_layers:
        out += [(name, tokens, n, k, dense_layers) for name, n, k in _mlp("", s["inter"], h, fused)]
    if model.moe_layers:
        L = model.moe_layers
        out.append(("router", tokens, model.experts, h, L))
        m_e, active = expert_tokens(tokens, model.top_k, model.experts)
        out += [(name, m_e, n, k, L * active)
                for name, n, k in _mlp("expert_", s["expert_inter"], h, fused)]
        if model.shared_intermediate:
            out += [(name, tokens, n, k, L)
                    for name, n, k in _mlp("shared_", s["shared_inter"], h, fused)]
    out.append(("lm_head", tokens, s["vocab"], h, 1))
    return out


def model_rows(model: Model, tokens=DEFAULT_TOKENS, *, tp: int = 1, fused: bool = True,
               name: str | None = None) -> list[dict]:
    """The shapes file's rows (module docstring: columns, weight rule)."""
    tokens = list(tokens)
    if not tokens or any(isinstance(t, bool) or not isinstance(t, int) or t < 1 for t in tokens):
        raise ConfigError(f"tokens must be positive integers, got {tokens}")
    rows = []
    for t in tokens:
        gemms = layer_gemms(model, t, tp=tp, fused=fused)
        total = sum(2 * m * n * k * c for _, m, n, k, c in gemms)
        for layer, m, n, k, c in gemms:
            rows.append(dict(M=m, N=n, K=k, layout="RC",
                             weight=f"{2 * m * n * k * c / total / len(tokens):.6g}",
                             layer=layer, model=name or model.name, tokens=t, count=c))
    return rows


def write_rows(rows: list[dict], path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    return path


def parse_tokens(text: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"--tokens must be comma-separated integers, got {text!r}") from None
    if not out or min(out) < 1:
        raise ConfigError(f"--tokens must be positive integers, got {text!r}")
    return list(dict.fromkeys(out))


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="a model folder or its config.json (read offline)")
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel degree (default 1)")
    parser.add_argument("--tokens", default=",".join(map(str, DEFAULT_TOKENS)),
                        help="token counts M, comma-separated (default powers of two 1..4096)")
    g = parser.add_mutually_exclusive_group()
    g.add_argument("--fused", dest="fused", action="store_true", default=True,
                   help="q/k/v and gate/up as one GEMM each, as serving engines run them (default)")
    g.add_argument("--separate", dest="fused", action="store_false",
                   help="q, k, v, gate, up as separate GEMMs, as transformers' modules run them")
    parser.add_argument("--name", default=None, help="the model column (default: the folder name)")
    parser.add_argument("--out", required=True, help="CSV to write")


def run_cli(args: argparse.Namespace) -> int:
    try:
        model = read_config(args.model)
        rows = model_rows(model, parse_tokens(args.tokens), tp=args.tp, fused=args.fused,
                          name=args.name)
    except ConfigError as exc:
        print(f"cudal2 shapes: {exc}", file=sys.stderr)
        return 2
    path = write_rows(rows, args.out)
    distinct = len({(r["M"], r["N"], r["K"]) for r in rows})
    print(f"cudal2 shapes: {model.name}, tp={args.tp}, {'fused' if args.fused else 'separate'}: "
          f"{len(rows)} rows ({distinct} distinct shapes, layout RC) -> {path}")
    return 0


if __name__ == "__main__":
    ns = argparse.ArgumentParser(prog="python -m cudal2.runs.shapes")
    configure_parser(ns)
    sys.exit(run_cli(ns.parse_args()))
