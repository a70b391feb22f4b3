"""A model's linear layers as a shapes file (`cudal2 shapes --model PATH`).

Reads a Hugging Face config offline (a model folder, its config.json, or a hub id `org/name`
already in the local Hugging Face cache; nothing is downloaded: the config's own JSON fields,
under the spellings transformers' config class for its model_type maps, never transformers'
defaults, so a missing field is an error, not a guess) and writes one row per GEMM a forward pass
runs on one tensor-parallel rank, at each token count:

    M,N,K,layout,weight,layer,model,tokens,count

`x @ W.t()`: M = tokens, N = output features, K = input features; an nn.Linear weight is (N, K)
row-major, so B is column-major: layout RC. GPT-2's Conv1D layers (c_attn, c_proj, c_fc) store
the weight as (K, N) and run `x @ W`: B is row-major, layout RR, as transformers runs them
(--separate); vLLM transposes them when it loads the checkpoint, so the default (fused, as
serving engines run them) writes RC for every row. The columns are those of shapes/llm_trace.csv
(plus `count`), so `cudal2 tune`, `cudal2 campaign prepare`, `cudal2 bench --weights` and
benchmarks/serving_trace.py read the file as they read that one (the planners take one layout
per file: a GPT-2 file written with --separate holds RR rows and an RC lm_head).

Model types (the config's `model_type`; a multimodal wrapper's `text_config`), per FAMILIES:
  gated MLP, act(gate(x)) * up(x) -> down: llama, mistral, qwen2, qwen3, gemma, gemma2,
    gemma3_text, granite, olmo, olmo2, stablelm, phi3 (its checkpoint fuses qkv_proj and
    gate_up_proj), and the mixtures of experts mixtral, qwen2_moe, qwen3_moe, olmoe, deepseek
    (DeepSeekMoE);
  non-gated MLP, up -> act -> down (fc1/fc2, c_fc/c_proj, dense_h_to_4h/dense_4h_to_h, fc_in/fc_out):
    gpt_neox, gpt2, gpt_bigcode, gptj, phi (phi-1, phi-2), opt, starcoder2, falcon.
  Refused, naming model_type: encoder-only and encoder-decoder types (bert, t5, ...), every type
  not listed, and multi-head latent attention (DeepSeek-V2/V3, any config with kv_lora_rank).
  A config with no model_type at all (hand-written) is read as the gated layout.

Layers (hd = head_dim, or hidden / heads when the config has none; kv = the kv heads:
num_key_value_heads, else heads; Falcon: num_kv_heads with new_decoder_architecture, else 1 when
multi_query, else heads; GPTBigCode: 1 when multi_query, else heads):
    qkv (fused, as serving engines run it)   N = (heads + 2 kv) hd      K = hidden
    q, k, v (separate, as transformers' modules; qkv when the checkpoint fuses them: gpt_neox,
        gpt2, gpt_bigcode, falcon, phi3)     N = heads hd, kv hd, kv hd
    o                                        N = hidden                K = heads hd
    gate_up (fused) or gate, up (separate; gate_up for phi3)   N = 2 I (or I each)   K = hidden
    up (non-gated MLPs)                      N = I                     K = hidden
    down                                     N = hidden                K = I
      I = intermediate_size (OPT: ffn_dim; GPT-2, GPTBigCode, GPT-J: n_inner, 4 hidden when null;
      Falcon: ffn_hidden_size, 4 hidden when absent, as its modeling code)
    router (mixture of experts)              N = experts               K = hidden
    expert_gate_up / expert_gate, expert_up, expert_down: as the MLP with I = moe_intermediate_size
        (Mixtral, OLMoE: intermediate_size), M = tokens each expert sees (below)
    shared_gate_up / ..., shared_down: the shared expert(s), M = tokens,
        I = shared_expert_intermediate_size (Qwen-MoE) or n_shared_experts x moe_intermediate_size
    shared_expert_gate (qwen2_moe: the sigmoid gate on the shared expert)  N = 1   K = hidden
    project_in, project_out (OPT when word_embed_proj_dim != hidden, e.g. OPT-350m)
                                             N = hidden, wepd          K = wepd, hidden
    lm_head                                  N = vocab                 K = hidden (OPT: wepd)
Tensor parallelism as Megatron and vLLM shard (tp ranks): column-parallel layers (qkv, q, k, v,
gate/up, up, experts' gate/up, lm_head) divide N, row-parallel ones (o, down, experts' down)
divide K; heads, kv heads (when kv >= tp) and the intermediate sizes must divide by tp; with
kv < tp every rank holds one replicated kv head (tp must be a multiple of kv); lm_head gets
ceil(vocab / tp) rows; the router, shared_expert_gate and OPT's projections are replicated.

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

The model column: the hub repo's name when the config lies in the Hugging Face cache
(models--org--name/snapshots/<rev>/ -> name, not the revision hash), else the config's
_name_or_path (its last part), else the folder's name; --name overrides.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import re
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
class Family:
    """How transformers' modeling file for a model_type builds a decoder layer's linears."""
    gated: bool = True             # act(gate(x)) * up(x) -> down; False: up (fc1) -> act -> down
    fused_qkv: bool = False        # the checkpoint holds q, k, v as one weight (c_attn, ...)
    fused_gate_up: bool = False    # the checkpoint holds gate and up as one weight (Phi-3)
    conv1d: bool = False           # GPT-2's Conv1D: weight (in, out), run as x @ W (layout RR)
    kv: str = "gqa"                # kv heads from: "gqa" num_key_value_heads, "falcon", "mqa"
    inter_field: str = "intermediate_size"
    inter_x4: bool = False         # no (or a null) intermediate size means 4 x hidden
    shared_gate: bool = False      # Qwen-MoE's shared_expert_gate (hidden -> 1) on the shared expert
    embed_proj: bool = False       # OPT: word_embed_proj_dim, with project_in/out when != hidden


GATED = Family()
NON_GATED = Family(gated=False)
FAMILIES = {
    **dict.fromkeys(("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text",
                     "granite", "olmo", "olmo2", "stablelm", "mixtral", "qwen3_moe", "olmoe",
                     "deepseek"), GATED),
    "qwen2_moe": Family(shared_gate=True),
    "phi3": Family(fused_qkv=True, fused_gate_up=True),
    "gpt_neox": Family(gated=False, fused_qkv=True),
    "gpt2": Family(gated=False, fused_qkv=True, conv1d=True, inter_x4=True),
    "gpt_bigcode": Family(gated=False, fused_qkv=True, kv="mqa", inter_x4=True),
    "gptj": Family(gated=False, inter_x4=True),
    "phi": NON_GATED,
    "opt": Family(gated=False, embed_proj=True),
    "starcoder2": NON_GATED,
    "falcon": Family(gated=False, fused_qkv=True, kv="falcon", inter_field="ffn_hidden_size",
                     inter_x4=True),
}
ENCODER_ONLY = {"bert", "roberta", "xlm-roberta", "camembert", "deberta", "deberta-v2",
                "distilbert", "albert", "electra", "mpnet", "ernie", "modernbert", "longformer",
                "big_bird", "nomic_bert", "xlm"}
ENCODER_DECODER = {"t5", "mt5", "umt5", "bart", "mbart", "pegasus", "marian", "whisper",
                   "encoder-decoder", "led", "switch_transformers"}
MLA = {"deepseek_v2", "deepseek_v3", "kimi_k2"}   # multi-head latent attention


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
    family: Family = GATED
    embed_proj: int = 0            # OPT's word_embed_proj_dim when it differs from hidden


# --- finding a config: a path, or a hub id in the local Hugging Face cache -----------------------
# A hub id as the Hub spells one ("org/name", or a legacy "name"); anything else is a path.
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")


def hub_cache() -> Path:
    """The cache folder huggingface_hub would use (its own order of variables), never created."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return Path(os.environ[var]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    return Path(home).expanduser() / "hub"


def _snapshot(repo_dir: Path) -> Path | None:
    """The cached snapshot to read: the revision refs/main names (what the Hub's main pointed at
    when it was downloaded), else the newest snapshot holding a config.json."""
    ref = repo_dir / "refs" / "main"
    if ref.is_file():
        rev = ref.read_text().strip()
        if not (repo_dir / "snapshots" / rev / "config.json").is_file():
            raise ConfigError(f"{repo_dir}: refs/main names revision {rev}, whose config.json is "
                              f"not in the cache (nothing is downloaded)")
        return repo_dir / "snapshots" / rev
    snaps = [d for d in (repo_dir / "snapshots").glob("*") if (d / "config.json").is_file()]
    return max(snaps, key=lambda d: (d.stat().st_mtime, d.name), default=None)


def cached_config(repo_id: str) -> Path:
    """config.json of hub id `repo_id` from the local cache; ConfigError names where it looked."""
    repo_dir = hub_cache() / ("models--" + repo_id.replace("/", "--"))
    snap = _snapshot(repo_dir) if repo_dir.is_dir() else None
    if snap is None:
        raise ConfigError(f"{repo_id}: no such file or folder, and not in the local Hugging Face "
                          f"cache (no {repo_dir}/snapshots/*/config.json); nothing is downloaded: "
                          f"give a model folder or its config.json, or download it first")
    return snap / "config.json"


def _config_path(path) -> Path:
    p = Path(path)
    if not p.exists() and HUB_ID.fullmatch(str(path)) and not str(path).endswith(".json"):
        return cached_config(str(path))
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        raise ConfigError(f"{p}: no such config file (give a model folder or its config.json)")
    return p


def model_name(p: Path, raw: dict) -> str:
    """The model column: the repo's name for a cached snapshot (its folder is a commit hash),
    else the last part of _name_or_path (often a path on the uploader's machine), else the
    folder's name."""
    snap = p.parent
    if snap.parent.name == "snapshots" and snap.parent.parent.name.startswith("models--"):
        return snap.parent.parent.name[len("models--"):].split("--")[-1]
    name = raw.get("_name_or_path") or snap.name or "model"
    return Path(str(name)).name


# --- reading a config ---------------------------------------------------------------------------
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


class _Fields:
    """A config's fields under every spelling, checked: ConfigError names the file and field."""

    def __init__(self, p: Path, raw: dict):
        self.p, self.raw = p, raw
        self.amap = _transformers_aliases(raw.get("model_type"))

    def _names(self, name):
        amap = self.amap
        return (name, *ALIASES.get(name, ()), *([amap[name]] if name in amap else []),
                *(k for k, v in amap.items() if v == name))

    def num(self, name, default=None, *, required=False, allow_zero=False):
        for n in self._names(name):
            v = self.raw.get(n)
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, int) or v < (0 if allow_zero else 1):
                raise ConfigError(f"{self.p}: field {n!r} must be a "
                                  f"{'non-negative' if allow_zero else 'positive'} integer, got {v!r}")
            return v
        if required:
            raise ConfigError(f"{self.p}: field {name!r} is missing")
        return default

    def flag(self, name, default=None):
        """A boolean field; with default None it is required."""
        v = self.raw.get(name)
        if v is None and default is not None:
            return default
        if v is None:
            raise ConfigError(f"{self.p}: field {name!r} is missing")
        if not isinstance(v, bool):
            raise ConfigError(f"{self.p}: field {name!r} must be true or false, got {v!r}")
        return v


def _load(p: Path) -> dict:
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
    return raw


def _family(p: Path, raw: dict) -> Family:
    """The model_type's Family; ConfigError names model_type for every type not derived here."""
    mt = raw.get("model_type")
    if raw.get("kv_lora_rank") or raw.get("q_lora_rank") or mt in MLA:
        raise ConfigError(f"{p}: field 'kv_lora_rank': multi-head latent attention is not supported")
    if mt is None:                  # hand-written configs: the generic (Llama) layout
        return GATED
    if mt in FAMILIES:
        return FAMILIES[mt]
    kind = ("an encoder-only model" if mt in ENCODER_ONLY else
            "an encoder-decoder model" if mt in ENCODER_DECODER else "not a supported decoder")
    raise ConfigError(f"{p}: field 'model_type' is {mt!r}: {kind}; supported: "
                      f"{', '.join(sorted(FAMILIES))}")


def _kv_field(f: _Fields, fam: Family, heads: int) -> tuple[str, int]:
    """(field, kv heads) as the modeling file counts them; Falcon and GPTBigCode from their
    flags (new_decoder_architecture absent: False, as in the configs that predate it)."""
    if fam.kv == "falcon" and f.flag("new_decoder_architecture", False):   # Falcon-40B/180B
        return "num_kv_heads", f.num("num_kv_heads", required=True)
    if fam.kv in ("falcon", "mqa"):   # Falcon-7B, StarCoder: one kv head; Falcon-RW: all
        return "multi_query", 1 if f.flag("multi_query") else heads
    return "num_key_value_heads", f.num("num_key_value_heads", heads)


def _kv_heads(f: _Fields, fam: Family, heads: int) -> int:
    field, kv = _kv_field(f, fam, heads)
    if heads % kv:
        raise ConfigError(f"{f.p}: field {field!r} ({kv}) does not divide "
                          f"'num_attention_heads' ({heads})")
    return kv


def _intermediate(f: _Fields, fam: Family, hidden: int, required: bool) -> int | None:
    """The dense MLP's width: the family's field, or 4 x hidden where its modeling code says so."""
    if fam.inter_x4:
        return f.num(fam.inter_field) or 4 * hidden
    return f.num(fam.inter_field, required=required)


def _attention(f: _Fields, fam: Family) -> tuple[int, int, int, int]:
    """(hidden, heads, kv heads, head_dim)."""
    hidden = f.num("hidden_size", required=True)
    heads = f.num("num_attention_heads", required=True)
    explicit_hd = f.num("head_dim")
    if explicit_hd is None and hidden % heads:
        raise ConfigError(f"{f.p}: field 'num_attention_heads' ({heads}) does not divide "
                          f"'hidden_size' ({hidden}) and there is no 'head_dim'")
    return hidden, heads, _kv_heads(f, fam, heads), explicit_hd or hidden // heads


def _moe(f: _Fields, layers: int, experts: int) -> dict:
    """The mixture-of-experts fields of Model."""
    top_k = f.num("num_experts_per_tok", required=True)
    if top_k > experts:
        raise ConfigError(f"{f.p}: field 'num_experts_per_tok' ({top_k}) exceeds the {experts} experts")
    moe_inter = f.num("moe_intermediate_size") or f.num("intermediate_size", required=True)
    shared = f.num("shared_expert_intermediate_size", 0, allow_zero=True) or (
        f.num("n_shared_experts", 0, allow_zero=True) * moe_inter)
    # Which layers are sparse: Qwen-MoE (decoder_sparse_step, mlp_only_layers), DeepSeekMoE
    # (first_k_dense_replace, moe_layer_freq); every layer otherwise (Mixtral).
    step, freq = f.num("decoder_sparse_step", 1), f.num("moe_layer_freq", 1)
    dense_only = f.raw.get("mlp_only_layers") or []
    if not isinstance(dense_only, list) or not all(isinstance(i, int) for i in dense_only):
        raise ConfigError(f"{f.p}: field 'mlp_only_layers' must be a list of layer numbers")
    first_dense = f.num("first_k_dense_replace", 0, allow_zero=True)
    sparse = [i for i in range(layers)
              if i not in dense_only and (i + 1) % step == 0 and i >= first_dense and i % freq == 0]
    return dict(experts=experts, top_k=top_k, expert_intermediate=moe_inter,
                shared_intermediate=shared, moe_layers=len(sparse))


def read_config(path) -> Model:
    """A Model from a config.json, a folder holding one, or a cached hub id. ConfigError names
    the bad field (or model_type, for a model this module does not derive)."""
    p = _config_path(path)
    raw = _load(p)
    fam = _family(p, raw)
    f = _Fields(p, raw)
    hidden, heads, kv, head_dim = _attention(f, fam)
    layers = f.num("num_hidden_layers", required=True)
    vocab = f.num("vocab_size", required=True)
    experts = f.num("num_local_experts", 0, allow_zero=True)
    moe = _moe(f, layers, experts) if experts else {}
    inter = _intermediate(f, fam, hidden, required=moe.get("moe_layers", 0) < layers)
    wepd = f.num("word_embed_proj_dim", hidden) if fam.embed_proj else hidden
    return Model(model_name(p, raw), hidden, heads, kv, head_dim, layers, inter, vocab, **moe,
                 family=fam, embed_proj=0 if wepd == hidden else wepd)


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
        out["inter"] = div(model.intermediate, model.family.inter_field)
    if model.experts:
        out["expert_inter"] = div(model.expert_intermediate, "moe_intermediate_size")
        if model.shared_intermediate:
            out["shared_inter"] = div(model.shared_intermediate, "shared_expert_intermediate_size")
    return out


def _mlp(prefix: str, inter: int, hidden: int, fused: bool, gated: bool = True
         ) -> list[tuple[str, int, int]]:
    if not gated:
        up = [(f"{prefix}up", inter, hidden)]
    elif fused:
        up = [(f"{prefix}gate_up", 2 * inter, hidden)]
    else:
        up = [(f"{prefix}gate", inter, hidden), (f"{prefix}up", inter, hidden)]
    return up + [(f"{prefix}down", hidden, inter)]


def _attn(model: Model, s: dict, fused: bool) -> list[tuple[str, int, int]]:
    """--separate splits q, k, v only where transformers' modules are split: a checkpoint that
    stores one qkv weight runs it as one GEMM there too."""
    h, hd = model.hidden, model.head_dim
    if fused or model.family.fused_qkv:
        out = [("qkv", (s["heads"] + 2 * s["kv"]) * hd, h)]
    else:
        out = [("q", s["heads"] * hd, h), ("k", s["kv"] * hd, h), ("v", s["kv"] * hd, h)]
    return out + [("o", h, s["heads"] * hd)]


def expert_tokens(tokens: int, top_k: int, experts: int) -> tuple[int, int]:
    """(tokens each active expert sees, active experts) under uniform routing."""
    assignments = tokens * top_k
    return -(-assignments // experts), min(experts, assignments)


def _moe_gemms(model: Model, s: dict, tokens: int, fused: bool) -> list:
    L, h = model.moe_layers, model.hidden
    out = [("router", tokens, model.experts, h, L)]
    m_e, active = expert_tokens(tokens, model.top_k, model.experts)
    out += [(name, m_e, n, k, L * active)
            for name, n, k in _mlp("expert_", s["expert_inter"], h, fused)]
    if model.shared_intermediate:
        out += [(name, tokens, n, k, L)
                for name, n, k in _mlp("shared_", s["shared_inter"], h, fused)]
        if model.family.shared_gate:   # sigmoid(x W) scales the shared expert; replicated
            out.append(("shared_expert_gate", tokens, 1, h, L))
    return out


def layer_gemms(model: Model, tokens: int, *, tp: int = 1, fused: bool = True
                ) -> list[tuple[str, int, int, int, int]]:
    """(layer, M, N, K, count per forward pass) of one rank at `tokens` tokens."""
    s = _shard(model, tp)
    h, fam = model.hidden, model.family
    out = [(name, tokens, n, k, model.layers) for name, n, k in _attn(model, s, fused)]
    dense_layers = model.layers - model.moe_layers
    if dense_layers:
        mlp = _mlp("", s["inter"], h, fused or fam.fused_gate_up, fam.gated)
        out += [(name, tokens, n, k, dense_layers) for name, n, k in mlp]
    if model.moe_layers:
        out += _moe_gemms(model, s, tokens, fused)
    head_k = model.embed_proj or h
    if model.embed_proj:   # OPT-350m: embeddings narrower than the layers, replicated projections
        out = [("project_in", tokens, h, head_k, 1)] + out + [("project_out", tokens, head_k, h, 1)]
    out.append(("lm_head", tokens, s["vocab"], head_k, 1))
    return out


def row_layout(model: Model, layer: str, fused: bool) -> str:
    """RC (nn.Linear), except GPT-2's Conv1D layers as transformers runs them (x @ W: RR)."""
    return "RR" if model.family.conv1d and not fused and layer != "lm_head" else "RC"


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
            rows.append(dict(M=m, N=n, K=k, layout=row_layout(model, layer, fused),
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
    parser.add_argument("--model", required=True,
                        help="a model folder, its config.json, or a hub id (org/name) already in "
                             "the local Hugging Face cache (read offline; nothing is downloaded)")
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel degree (default 1)")
    parser.add_argument("--tokens", default=",".join(map(str, DEFAULT_TOKENS)),
                        help="token counts M, comma-separated (default powers of two 1..4096)")
    g = parser.add_mutually_exclusive_group()
    g.add_argument("--fused", dest="fused", action="store_true", default=True,
                   help="q/k/v and gate/up as one GEMM each, as serving engines run them (default)")
    g.add_argument("--separate", dest="fused", action="store_false",
                   help="q, k, v, gate, up as separate GEMMs, as transformers' modules run them "
                        "(a checkpoint's fused weight, e.g. GPT-NeoX's query_key_value, stays one)")
    parser.add_argument("--name", default=None, help="the model column (default: the cached repo's name, "
                        "else the config's _name_or_path, else the folder name)")
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
    layouts = sorted({r["layout"] for r in rows})
    # GPT-2 --separate mixes RR Conv1D rows with an RC lm_head; the planners take one per file
    note = "; the planners take one layout per file" if len(layouts) > 1 else ""
    print(f"cudal2 shapes: {model.name}, tp={args.tp}, {'fused' if args.fused else 'separate'}: "
          f"{len(rows)} rows ({distinct} distinct shapes, layout {'+'.join(layouts)}{note}) -> {path}")
    return 0


if __name__ == "__main__":
    ns = argparse.ArgumentParser(prog="python -m cudal2.runs.shapes")
    configure_parser(ns)
    sys.exit(run_cli(ns.parse_args()))
