"""The `cudal2` command: one verb per module, each a thin wrapper over that module.

Each module that backs a verb defines `configure_parser(parser)` and `run_cli(args) -> int`.
Only the chosen verb's module is imported, so `cudal2 build` never loads pandas or trl. RL
stands above the library and has its own command (`cudal2-rl`, = `python -m cudal2_rl.train`).
"""
from __future__ import annotations

import argparse
import importlib
import logging
import sys

from cudal2.core import knobs

# verb -> (module, one-line help)
VERBS: dict[str, tuple[str, str]] = {
    "templates": ("cudal2.templates.cli", "write reference kernel files from the template families (`--list`, `--defaults DIR`, `--build-space FAMILY --csv OUT`)"),
    "build": ("cudal2.core.build", "compile kernel files into the build cache (nvcc, no GPU needed)"),
    "audit": ("cudal2.harness.audit", "build and audit kernel files: imports, includes, accumulator, resources"),
    "bench": ("cudal2.runs.bench", "time kernels against torch, cuBLAS and cuBLASLt; write a report (`--overhead`: host cost per call)"),
    "tune": ("cudal2.search.tune", "search the template families per shape (`--build-only` on CPU machines)"),
    "export": ("cudal2.runs.export", "copy measured winners from the results DB into generated_kernels/"),
    "campaign": ("cudal2.runs.campaign", "prepare a GPU campaign on a CPU machine, run it on a GPU machine"),
    "shapes": ("cudal2.runs.shapes", "a model's linear layers as a shapes CSV, from its Hugging Face config (offline)"),
    "report": ("cudal2.runs.report", "summaries from the results DB (`--compare`: search vs RL vs baselines; `--coverage`: shapes measured and exported per FLOP bucket)"),
    "db": ("cudal2.runs.merge", "results DBs: `merge A.db B.db.gz ... --into C.db` accumulates runs without duplicates"),
}


def _usage() -> str:
    width = max(map(len, VERBS))
    lines = ["usage: cudal2 VERB [options]   (cudal2 VERB --help for a verb's options)", "", "verbs:"]
    lines += [f"  {verb:<{width}}  {help_}" for verb, (_, help_) in VERBS.items()]
    lines += ["", "environment knobs: " + ", ".join(k.name for k in knobs.KNOBS)]
    return "\n".join(lines)


# (verb, flag) -> the module that serves the verb with that flag (the flag is dropped)
FLAG_MODULES = {("bench", "--overhead"): "cudal2.runs.overhead",
                ("report", "--coverage"): "cudal2.runs.coverage"}
# Options whose presence picks the module and which that module's parser takes itself.
OPTION_MODULES = {("bench", "--model"): "cudal2.runs.modelbench"}   # a model's passes as CUDA graphs


def module_for(verb: str, rest: list[str]) -> tuple[str, list[str]]:
    """The module that serves `cudal2 VERB REST...` and the arguments its parser gets."""
    for (v, flag), module in FLAG_MODULES.items():
        if v == verb and flag in rest:
            return module, [a for a in rest if a != flag]
    for (v, opt), module in OPTION_MODULES.items():
        if v == verb and any(a == opt or a.startswith(opt + "=") for a in rest):
            return module, rest
    return VERBS[verb][0], rest


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=knobs.log_level().upper(), format="%(levelname)s %(name)s: %(message)s")
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0 if argv else 2
    verb, rest = argv[0], argv[1:]
    if verb not in VERBS:
        print(f"cudal2: unknown verb {verb!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module_name, rest = module_for(verb, rest)
    module = importlib.import_module(module_name)
    parser = argparse.ArgumentParser(prog=f"cudal2 {verb}", description=VERBS[verb][1])
    module.configure_parser(parser)
    args = parser.parse_args(rest)
    try:
        return int(module.run_cli(args) or 0)
    except KeyboardInterrupt:
        print(f"cudal2 {verb}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
