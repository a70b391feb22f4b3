"""Multi-turn refinement (``--turns N``), as Kevin-32B trains it.

Each GRPO group of ``num_generations`` samples for a shape holds ``num_generations / N``
trajectories of N turns. Turn 1 answers the prompt; turn t+1 sees the conversation so far plus
feedback on turn t's kernel: the verdict, the compiler's error lines, ptxas registers / shared
memory / spills, the audit's findings, the correctness failure, the speed and time (measured, or
flagged estimated / screened) and bottleneck hints (rl.reward.bottleneck_hints: spills, register
pressure, where the measured time sits against the GPU's roofline, or the estimate's terms). Every turn's kernel goes through the reward like any completion
(its own results-DB row, cached like the rest). Each turn is its own training sample (prompt =
the conversation up to it, completion = its answer) with the discounted return of its
trajectory from that turn on:

    R_t = r_t + gamma * R_{t+1}          (gamma = --gamma, Kevin: 0.4; R_{N+1} = 0)

so a turn is credited for the improvements it enables. trl's ``rollout_func`` hook generates the
turns (with the trainer's own sampling settings); the reward function then hands trl the
returns (``turn_return``). A previous answer's reasoning block is dropped from the context;
when the context would not fit the model, the previous answer is dropped too and only the
feedback stays (summarised context).
"""
from __future__ import annotations

import re
from typing import Any, Callable

from cudal2_rl.extract import completion_text, strip_reasoning

_SHAPE = re.compile(r"M\s*=\s*(\d+)\D{1,4}N\s*=\s*(\d+)\D{1,4}K\s*=\s*(\d+)")


def returns(rewards: list[float | None], gamma: float) -> list[float | None]:
    """Discounted returns of one trajectory's per-turn rewards; a turn without a reward (a
    harness error) has none, and passes nothing back to earlier turns."""
    out: list[float | None] = [None] * len(rewards)
    nxt = 0.0
    for t in range(len(rewards) - 1, -1, -1):
        r = rewards[t]
        if r is None:
            out[t], nxt = None, 0.0
        else:
            out[t] = r + gamma * nxt
            nxt = out[t]
    return out


def _trim(text: str, n: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 3] + "..."


def _error_lines(log: str, n: int = 4) -> list[str]:
    rows = [r.strip() for r in (log or "").splitlines() if r.strip()]
    errs = [r for r in rows if "error" in r.lower()]
    return (errs or rows[-n:])[:n]


def feedback(a, style: str = "full") -> str:
    """What the policy is told about its previous kernel (an rl.reward.Attempt)."""
    speed = ""
    if a.speedup is not None:
        tag = "estimated " if a.estimated else "screened " if a.stage == "screen" else ""
        speed = f"{tag}speedup {a.speedup:.2f}x vs the baseline"
    b = a.build or {}
    if style == "compact":
        parts = [f"result {a.verdict}"]
        if speed:
            parts.append(speed)
        if a.verdict == "build_error":
            errs = _error_lines(b.get("log_tail", ""), 1)
            if errs:
                parts.append(_trim(errs[0], 60))
        elif a.detail and a.verdict not in ("ok", "not_measured"):
            parts.append(_trim(a.detail, 60))
        return "; ".join(parts) + "; revise"
    lines = [f"Your previous kernel: verdict `{a.verdict}`"
             + (f", reward {a.reward:+.3f}" if a.reward is not None else "") + "."]
    if speed:
        lines.append(f"- speed: {speed}" + (" (the best known for this shape is "
                                              f"{a.reference:.2f}x)" if a.reference > 1 else ""))
    if getattr(a, "time_us", None):
        lines.append(f"- time: {a.time_us:.1f} us" + (" (estimated, no GPU)" if a.estimated else
                                                         " (screened)" if a.stage == "screen" else " (measured)"))
    if a.verdict == "build_error":
        lines += [f"- compiler: {_trim(l, 300)}" for l in _error_lines(b.get("log_tail", ""))]
    if b.get("registers") is not None and a.compiled:
        lines.append(f"- ptxas: {b.get('registers')} registers, {b.get('shared_bytes', 0)} B static "
                     f"shared memory, {b.get('spills', 0)} B spills")
    for r in getattr(a, "audit", None) or []:
        lines.append(f"- audit: {_trim(r, 300)}")
    for h in getattr(a, "hints", None) or []:
        lines.append(f"- bottleneck: {_trim(h, 300)}")
    if a.verdict in ("wrong", "crashed", "timeout", "oom", "too_fast", "audit_rejected",
                     "no_code", "two_files", "not_abi") and a.detail:
        lines.append(f"- why: {_trim(a.detail, 400)}")
    lines.append("Revise the kernel (faster if it was correct, correct if it was not). Answer with "
                 "exactly one fenced ```cuda code block holding the whole kernel file.")
    return "\n".join(lines)


def _shape_of(prompt, known: dict) -> tuple[int, int, int]:
    text = prompt[-1]["content"] if isinstance(prompt, list) else str(prompt)
    if text in known:
        return known[text]
    m = _SHAPE.search(text)
    if not m:
        raise ValueError(f"multi-turn: cannot tell the shape of prompt {text[:80]!r}")
    return tuple(int(x) for x in m.groups())  # type: ignore[return-value]


def make_rollout(reward, *, turns: int, gamma: float, style: str = "full",
                 prompt_shapes: dict | None = None, log: Callable[..., Any] | None = None):
    """trl rollout_func(prompts, trainer) for `turns`-turn refinement (see the module doc)."""

    known = prompt_shapes if prompt_shapes is not None else {}

    def rollout(prompts, trainer):
        G = trainer.num_generations
        if G % turns:
            raise ValueError(f"--num-generations ({G}) must be a multiple of --turns ({turns})")
        n_traj = G // turns
        tok = trainer.processing_class
        max_pos = getattr(getattr(trainer.model, "config", None), "max_position_embeddings", None)
        max_new = getattr(trainer.args, "max_completion_length", 0) or 0
        # one trajectory per (block, j): block = G consecutive copies of one prompt
        trajs = []
        for b in range(0, len(prompts), G):
            for _ in range(n_traj):
                trajs.append({"conv": list(prompts[b]), "shape": _shape_of(prompts[b], known),
                              "turns": []})
        for t in range(1, turns + 1):
            convs = [tr["conv"] for tr in trajs]
            ids, _images, mm = trainer._tokenize_prompts(convs)
            ids = [list(x) for x in ids]
            out_ids, _logps = trainer._generate_single_turn(ids, None, mm, 1)
            out_ids = [list(x) for x in out_ids]
            texts = tok.batch_decode(out_ids, skip_special_tokens=True)
            atts = reward.score_attempts(texts, [tr["shape"] for tr in trajs], turn=t)
            for tr, p, c, text, a in zip(trajs, ids, out_ids, texts, atts):
                tr["turns"].append((p, c, a))
                if t == turns:
                    continue
                answer, _open = strip_reasoning(completion_text(text))
                fb = feedback(a, style)
                conv = tr["conv"] + [{"role": "assistant", "content": answer.strip()},
                                     {"role": "user", "content": fb}]
                if max_pos:   # keep the context inside the model: drop the old answer first
                    n = len(trainer._tokenize_prompts([conv])[0][0])
                    if n + max_new > max_pos:
                        conv = tr["conv"][:1] + [{"role": "user", "content": fb}]
                        if style == "compact":
                            conv = [{"role": "user", "content": tr["conv"][0]["content"] + " | " + fb}]
                tr["conv"] = conv
        prompt_ids, completion_ids, rets, turn_no = [], [], [], []
        for tr in trajs:
            rs = returns([a.reward for _p, _c, a in tr["turns"]], gamma)
            for k, ((p, c, _a), r) in enumerate(zip(tr["turns"], rs)):
                prompt_ids.append(p)
                completion_ids.append(c)
                rets.append(r)
                turn_no.append(k + 1)
        if log is not None:
            per_turn = {}
            for tr in trajs:
                for k, (_p, _c, a) in enumerate(tr["turns"]):
                    if a.reward is not None:
                        per_turn.setdefault(k + 1, []).append(a.reward)
            log(type="turns", rewards={t: sum(v) / len(v) for t, v in per_turn.items()})
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": None,
                "turn_return": rets, "turn": turn_no}

    return rollout
