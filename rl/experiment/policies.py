"""The policy arms' two pieces: a proposer (a policy sampled as it was in training, its
completions reduced to kernel sources) and a keyer (a source -> its binary key, which looks the
table up). Tests replace both with plain callables: `propose(shape, n, seed) -> [source | None]`
and `keyer(source) -> key | None`."""
from __future__ import annotations

from dataclasses import dataclass

from cudal2.core.identity import source_sha


@dataclass
class PolicySettings:
    name: str
    style: str
    max_new_tokens: int
    temperature: float
    min_p: float


def arm_settings(name: str, run_config: dict | None = None, *, style: str = "") -> PolicySettings:
    """How an arm samples: as its policy did in training (the RL run's config where it set
    them, else the defaults of the policy it started from)."""
    from cudal2_rl.policy import default_max_tokens, default_sampling, default_style
    cfg = run_config or {}
    base = cfg.get("policy") or name
    temperature, min_p = default_sampling(base, cfg.get("temperature"), cfg.get("min_p"))
    tokens = int(cfg.get("max_completion_length") or 0) or default_max_tokens(base)
    return PolicySettings(name, style or default_style(base), tokens, temperature, min_p)


def lm_proposer(settings: PolicySettings, *, arch: str, acc: str, small_builtin: bool = False, log=print):
    """A proposer sampling the policy `settings.name` (cudal2_rl.policy.load_policy)."""
    from cudal2.harness.types import Shape
    from cudal2_rl import extract
    from cudal2_rl.policy import SMALL_RECIPE, BuiltinRecipe, load_policy, sample, sampling_device
    from cudal2_rl.prompts import make_prompt
    try:
        model, tok = load_policy(settings.name, recipe=SMALL_RECIPE if small_builtin else BuiltinRecipe(), log=log)
    except (ValueError, OSError) as exc:
        raise ValueError(f"policy {settings.name!r}: {exc}") from None
    model.to(sampling_device()).eval()

    def propose(shape, n: int, seed: int) -> list:
        prompt = make_prompt(settings.style, Shape(*shape), arch, acc)
        texts = sample(model, tok, [prompt], n=n, max_new_tokens=settings.max_new_tokens,
                       temperature=settings.temperature, min_p=settings.min_p, seed=seed)
        return [ex.source if ex.ok else None for ex in map(extract.extract, texts)]
    return propose


class Keyer:
    """source -> binary key: the table's own key for a source it holds (same text, same
    binary), else the key of a local build (cudal2.core.build, cached; None when it does not
    build). The key includes the toolchain: a build with another nvcc than the table's misses."""

    def __init__(self, table, arch: str, build=None):
        self.arch = arch
        self.known = {e.source_sha: e.binary_key for s in table.shapes() for e in table.entries(s)}
        self._build = build or self._nvcc

    def _nvcc(self, source: str) -> str | None:
        from cudal2.core.build import BuildSpec, build
        br = build(BuildSpec(source, arch=self.arch, name="experiment"))
        return getattr(br, "binary_key", None) if br.ok else None

    def __call__(self, source: str) -> str | None:
        sha = source_sha(source)
        if sha not in self.known:
            self.known[sha] = self._build(source)
        return self.known[sha]
