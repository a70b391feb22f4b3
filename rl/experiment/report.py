"""The experiment's outputs in --out: experiment.json (the setup, the notes, what remains),
rows.jsonl + per_shape.csv (one row per arm, shape and seed), confirm.jsonl + sources/ (per shape,
each arm's held-out winners, for one finals session per shape on a later GPU call), summary.json,
and table.md / README.md, which answer the question in words with the numbers and intervals."""
from __future__ import annotations

import csv
import json
import time
from pathlib import Path

from cudal2_rl.experiment import statistics
from cudal2_rl.experiment.arms import REFERENCE, SEARCH_ARMS
from cudal2_rl.experiment.heldout import MIN_SEEDS, MIN_SHAPES, name

QUESTION = "Does RL learn a better search prior over a measured space than search does?"
CSV_COLS = ("arm", "M", "N", "K", "seed", "entries", "evaluations", "hits", "misses", "repeats",
            "samples", "no_code", "no_build", "gpu_seconds", "charged_evaluations",
            "charged_gpu_seconds", "winner_key", "winner_us", "best_us", "baseline_us")


def confirm(table, rows) -> tuple[list[dict], dict]:
    """(confirm.jsonl lines, {source_sha: source}): per shape, every distinct winner with the
    arms and seeds that chose it (the exhaustive best among them)."""
    lines, sources = [], {}
    for shape in sorted({(r["M"], r["N"], r["K"]) for r in rows}):
        by_key: dict = {}
        for r in rows:
            if (r["M"], r["N"], r["K"]) == shape and r["winner_key"]:
                by_key.setdefault(r["winner_key"], []).append([r["arm"], r["seed"]])
        entrants = []
        for key, chosen in sorted(by_key.items()):
            e = table.lookup(key, shape)
            sources[e.source_sha] = e.source
            entrants.append({"binary_key": key, "source_sha": e.source_sha, "table_us": e.reference_us,
                             "source_file": f"sources/{e.source_sha}.cu", "chosen_by": chosen})
        lines.append({"M": shape[0], "N": shape[1], "K": shape[2], "arch": table.arch, "gpu": table.gpu,
                      "baseline": "cublaslt_autotuned", "entrants": entrants})
    return lines, sources


def write_run(out: Path, setup: dict, rows: list[dict], lines: list[dict], sources: dict) -> None:
    """The raw outputs a merge reads back."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "sources").mkdir(exist_ok=True)
    for sha, src in sources.items():
        (out / "sources" / f"{sha}.cu").write_text(src)
    (out / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (out / "confirm.jsonl").write_text("".join(json.dumps(c) + "\n" for c in lines))
    doc = {**setup, "finished": setup.get("finished") or time.time()}
    (out / "experiment.json").write_text(json.dumps(doc, indent=1))


def _f(x, spec=".3f") -> str:
    return "n/a" if x is None else format(x, spec)


def verdict(p: dict | None, a: str, b: str) -> str:
    """One sentence on a paired ratio a/b."""
    if p is None:
        return f"{a} vs {b}: no (shape, seed) where both found a measured kernel."
    iv = (f"{a}'s winners take {_f(p['ratio'])}x {b}'s time [{_f(p['lo'])}, {_f(p['hi'])}] "
          f"({p['pairs']} (shape, seed) pairs, {p['shapes']} shapes)")
    if p["hi"] < 1.0:
        return f"{a} beats {b}: {iv}."
    if p["lo"] > 1.0:
        return f"{b} beats {a}: {iv}."
    return f"{a} and {b} are not distinguishable: {iv}."


def answer(summary: dict, arms, *, pilot: bool, remaining: list, misses: int) -> list[str]:
    """The question, answered plainly, then what limits the answer."""
    pairs = {(p["a"], p["b"]): p for p in summary["paired"]}
    lines = [f"**{QUESTION}**", ""]
    if "rl" not in arms:
        lines.append("Not answered: the run has no RL arm.")
    else:
        ps = [pairs.get(("rl", b)) for b in SEARCH_ARMS if b in arms]
        if ps and all(p and p["hi"] < 1.0 for p in ps):
            lines.append("**Yes**: at an equal budget RL's held-out winners are faster than every search arm's.")
        elif any(p and p["lo"] > 1.0 for p in ps):
            lines.append("**No**: a search arm's held-out winners are faster than RL's at an equal budget.")
        else:
            lines.append("**Not shown**: at this size the intervals do not separate RL from search.")
    lines.append("")
    lines += [f"- {verdict(pairs.get((a, b)), a, b)}" for a, b in pairs]
    if pilot:
        lines.append(f"- PILOT: fewer than {MIN_SHAPES} held-out shapes or {MIN_SEEDS} seeds; this answers nothing yet.")
    if remaining:
        lines.append(f"- PARTIAL: {len(remaining)} held-out shape(s) not run yet (other shards, or no table rows yet): "
                     + ", ".join(map(name, remaining[:12])) + (" ..." if len(remaining) > 12 else ""))
    if misses:
        lines.append(f"- {misses} policy read(s) missed the table (queued for the GPU, queue.jsonl): "
                     "those evaluations returned no value; rerun after a GPU call screens the queue.")
    return lines


def arm_table(summary: dict) -> list[str]:
    md = ["| arm | winner / exhaustive best (95% interval) | found the best | fast_1 vs cuBLASLt (n; no baseline) "
          "| evaluations / shape (+ charged) | GPU-s / shape (+ charged) | hits / misses |",
          "|---|---|---|---|---|---|---|"]
    for a in summary["per_arm"]:
        v, f, s = a["vs_best"], a["fast_1"], a["spend"]
        ratio = f"{_f(v['ratio'])} [{_f(v['lo'])}, {_f(v['hi'])}]" if v else "no winner"
        found = f"{v['found_best']}/{v['n'] + v['no_winner']}" if v else "0"
        md.append(f"| {a['arm']} | {ratio} | {found} | {_f(f['fast_1'], '.2f')} ({f['n']}; {f['no_baseline']}) | "
                  f"{s['evaluations']:.1f} (+{s['charged_evaluations']}) | {s['gpu_seconds']:.2f} "
                  f"(+{s['charged_gpu_seconds']:.2f}) | {s['hits']} / {s['misses']} |")
    return md


def paired_table(summary: dict) -> list[str]:
    md = ["| arm a | arm b | a's winner time / b's (95% interval) | pairs (shapes) | a faster | b faster | unpaired |",
          "|---|---|---|---|---|---|---|"]
    md += [f"| {p['a']} | {p['b']} | {_f(p['ratio'])} [{_f(p['lo'])}, {_f(p['hi'])}] | {p['pairs']} ({p['shapes']}) "
           f"| {p['a_faster']} | {p['b_faster']} | {p['unpaired']} |" for p in summary["paired"]]
    return md


HOW = ("Every evaluation is a read of the reward table (measured rows keyed by binary), so each "
       "ratio is exact against the table's exhaustive best at the shape. Intervals: percentile "
       "bootstrap resampling held-out shapes, then each drawn shape's seeds. Budget: evaluations "
       "(distinct binaries asked for; a miss counts) and the GPU-seconds the table spent on the rows "
       "read; the RL arm is charged its training reads, ceil(T / n) evaluations and G / n GPU-s per shape.")


def write_report(out: Path, setup: dict, rows: list[dict], *, remaining: list, command: str) -> dict:
    arms = list(setup["arms"])
    summary = statistics.summarise(rows, arms + [REFERENCE], seed=setup["boot_seed"])
    misses = sum(r["misses"] for r in rows if r["arm"] != REFERENCE)
    pilot = setup["pilot"] or len({(r["M"], r["N"], r["K"]) for r in rows}) < MIN_SHAPES
    title = (f"RL vs search over the reward table ({setup['table'].get('gpu')}, {setup['table'].get('arch')}): "
             f"{len({(r['M'], r['N'], r['K']) for r in rows})} held-out shapes x {len(setup['seeds'])} seeds")
    said = answer(summary, arms, pilot=pilot, remaining=remaining, misses=misses)
    md = [f"# {title}" + (" (PILOT)" if pilot else ""), ""] + said + ["", "## Per arm", ""] + arm_table(summary)
    md += ["", "## Paired (same shape and seed)", ""] + paired_table(summary) + ["", HOW, ""]
    md += [f"- {n}" for n in setup.get("notes", [])] + ["", f"Made by: `{command}`"]
    (out / "table.md").write_text("\n".join(md) + "\n")
    readme = [f"# {title}" + (" (PILOT)" if pilot else ""), ""] + said + [
        "", "Files: `table.md` (the numbers), `per_shape.csv` / `rows.jsonl` (per arm, shape and seed), "
        "`summary.json`, `experiment.json` (setup, held-out shapes, what remains), `confirm.jsonl` + "
        "`sources/` (each arm's winners per shape, for one GPU finals session per shape), "
        "`queue.jsonl` (table misses for the GPU).", "", f"Command: `{command}`"]
    (out / "README.md").write_text("\n".join(readme) + "\n")
    with (out / "per_shape.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_COLS, extrasaction="ignore", lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    doc = {"summary": summary, "pilot": pilot, "remaining": [list(s) for s in remaining], "misses": misses}
    (out / "summary.json").write_text(json.dumps(doc, indent=1))
    return doc
