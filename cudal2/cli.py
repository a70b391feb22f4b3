"""The `cudal2` command: one verb per module, each a thin wrapper over that module.

Each module that backs a verb defines `configure_parser(parser)` and `run_cli(args) -> int`.
Only the chosen verb's module is imported, so `cudal2 build` never loads pandas or trl, and
`cudal2 VERB --help` never loads torch (tests/test_cli_errors.py). An error the user can act on
(KNOWN_ERRORS: bad input, a missing file, a file that is not a results DB) is one line on stderr,
`cudal2 VERB: message`, exit 2; CUDAL2_LOG=debug shows its traceback. RL
stands above the library and has its own command (`cudal2-rl`, = `python -m cudal2_rl.train`).
"""
from __future__ import annotations

import argparse
import functools
import importlib
import logging
import sqlite3
import sys

from cudal2 import __version__
from cudal2.core import knobs
from cudal2.core.toolchain import ToolchainError
from cudal2.harness.db import DBError

# verb -> (module, one-line help)
VERBS: dict[str, tuple[str, str]] = {
    "templates": ("cudal2.templates.cli", "write reference kernel files from the template families (`--list`, `--defaults DIR`, `--build-space FAMILY --csv OUT`, `--explain CONFIG --shape MxNxK`: a decode config's streaming budget)"),
    "build": ("cudal2.core.build", "compile kernel files into the build cache (nvcc, no GPU needed)"),
    "audit": ("cudal2.harness.audit", "build and audit kernel files: imports, includes, accumulator, resources"),
    "bench": ("cudal2.runs.bench", "time kernels against torch, cuBLAS and cuBLASLt; write a report (`--overhead`: host cost per call)"),
    "tune": ("cudal2.search.tune", "search the template families per shape (`--build-only` on CPU machines)"),
    "export": ("cudal2.runs.export", "copy measured winners from the results DB into your kernel table ($CUDAL2_CACHE/kernels; `--out generated_kernels`: the shipped one)"),
    "served": ("cudal2.runs.served", "list what dispatch serves on this GPU (or `--arch`): shape or M bucket, layout, family, config, lower bound vs the fastest baseline, the GPU that measured it, which table"),
    "warmup": ("cudal2.runs.warmup", "build (or find built) every kernel the table serves here, so no call builds one"),
    "reaudit": ("cudal2.runs.reaudit", "audit a kernel table's rows again under this cudal2's rules (a row audited under older ones does not serve until then)"),
    "campaign": ("cudal2.runs.campaign", "prepare a GPU campaign on a CPU machine, run it on a GPU machine"),
    "shapes": ("cudal2.runs.shapes", "a model's linear layers as a shapes CSV, from its Hugging Face config (offline)"),
    "tune-model": ("cudal2.runs.tunemodel", "a model's GEMMs tuned on this GPU in one resumable command: shapes, campaign prepare, run, export, the served table and the model replay (the CPU half without a GPU)"),
    "report": ("cudal2.runs.report", "summaries from the results DB (`--compare`: search vs RL vs baselines; `--coverage`: shapes measured and exported per FLOP bucket; `--explain`: per shape, measured beside predicted and the physics, ranked by the gap; `--budget`: the streaming budget against the committed decode rows, and its fit)"),
    "db": ("cudal2.runs.merge", "results DBs: `merge A.db B.db.gz ... --into C.db` accumulates runs without duplicates; `backfill-keys DB...` records the binary keys of rows recorded before keys"),
}


def _usage() -> str:
    width = max(map(len, VERBS))
    lines = ["usage: cudal2 VERB [options]   (cudal2 VERB --help for a verb's options)", "", "verbs:"]
    lines += [f"  {verb:<{width}}  {help_}" for verb, (_, help_) in VERBS.items()]
    lines += ["", "environment knobs: " + ", ".join(k.name for k in knobs.KNOBS if not k.internal)]
    return "\n".join(lines)


# (verb, flag) -> the module that serves the verb with that flag (the flag is dropped)
FLAG_MODULES = {("bench", "--overhead"): "cudal2.runs.overhead",
                ("report", "--coverage"): "cudal2.runs.coverage",
                ("report", "--explain"): "cudal2.runs.explain",
                ("report", "--budget"): "cudal2.runs.budgetfit",
                ("templates", "--explain"): "cudal2.templates.explain"}
# Options whose presence picks the module and which that module's parser takes itself.
OPTION_MODULES = {("bench", "--model"): "cudal2.runs.modelbench"}   # a model's passes as CUDA graphs
# (verb, first argument) -> the module that serves that action (the action is dropped).
ACTION_MODULES = {("db", "backfill-keys"): "cudal2.runs.backfill"}


def module_for(verb: str, rest: list[str]) -> tuple[str, list[str]]:
    """The module that serves `cudal2 VERB REST...` and the arguments its parser gets."""
    for (v, flag), module in FLAG_MODULES.items():
        if v == verb and flag in rest:
            return module, [a for a in rest if a != flag]
    if rest and (verb, rest[0]) in ACTION_MODULES:
        return ACTION_MODULES[verb, rest[0]], rest[1:]
    for (v, opt), module in OPTION_MODULES.items():
        if v == verb and any(a == opt or a.startswith(opt + "=") for a in rest):
            return module, rest
    return VERBS[verb][0], rest


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr (exit 2), like every other CLI error."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: {message} (`{self.prog} --help` lists the options)\n")


# Errors that describe the user's input or machine, not a bug: a verb raising one gets a one-line
# message and exit 2. ValueError is the project's type for bad input (knobs, CSVs, index rows:
# KernelIndexError, ConfigError); OSError a file that cannot be read or written; DBError and
# sqlite3's database errors a results DB that is not one; ToolchainError a missing nvcc or header.
# Anything else (TypeError, KeyError, AttributeError, RuntimeError from torch or a worker) is a
# bug or a GPU failure that needs its traceback, so it propagates.
KNOWN_ERRORS = (ValueError, OSError, DBError, ToolchainError, sqlite3.DatabaseError, ModuleNotFoundError)


def _known(exc: BaseException) -> bool:
    if isinstance(exc, sqlite3.ProgrammingError):          # misuse of the API: a bug
        return False
    if isinstance(exc, ModuleNotFoundError):               # a missing optional dependency only
        return not (exc.name or "cudal2").startswith("cudal2")
    return isinstance(exc, KNOWN_ERRORS)


def _one_line(exc: BaseException) -> str:
    """The error as one line: an OSError as `file: reason`, a missing module with what to install."""
    if isinstance(exc, ModuleNotFoundError):
        return f"{exc} (install it, e.g. pip install 'cudal2[tune]')"
    if isinstance(exc, OSError) and exc.filename is not None:
        text = f"{exc.filename}: {exc.strerror or exc}"
    else:
        text = str(exc) or type(exc).__name__
    return "; ".join(line.strip() for line in text.splitlines() if line.strip())


def _debug() -> bool:
    try:
        return knobs.log_level() == "debug"
    except ValueError:
        return False


def _clean_errors(run):
    """Wraps main: a known error (KNOWN_ERRORS) anywhere in a verb, its import or the knobs
    becomes one line `cudal2 VERB: message` and exit 2; CUDAL2_LOG=debug re-raises it."""
    @functools.wraps(run)
    def wrapper(argv: list[str] | None = None) -> int:
        args = list(sys.argv[1:] if argv is None else argv)
        who = f"cudal2 {args[0]}" if args and args[0] in VERBS else "cudal2"
        try:
            return run(args)
        except KeyboardInterrupt:
            print(f"{who}: interrupted", file=sys.stderr)
            return 130
        except Exception as exc:                           # noqa: BLE001 - filtered by _known
            if not _known(exc) or _debug():                # CUDAL2_LOG=debug: the traceback
                raise
            print(f"{who}: {_one_line(exc)}", file=sys.stderr)
            return 2
    return wrapper


@_clean_errors
def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    knobs.check_env()       # a bad CUDAL2_* value or a misspelt name: one line, before any work
    logging.basicConfig(level=knobs.log_level().upper(), format="%(levelname)s %(name)s: %(message)s")
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0 if argv else 2
    if argv[0] in ("-V", "--version"):
        print(f"cudal2 {__version__}")
        return 0
    verb, rest = argv[0], argv[1:]
    if verb not in VERBS:
        print(f"cudal2: unknown verb {verb!r}; verbs: {', '.join(VERBS)} (cudal2 --help)", file=sys.stderr)
        return 2
    module_name, rest = module_for(verb, rest)
    module = importlib.import_module(module_name)
    parser = _Parser(prog=f"cudal2 {verb}", description=VERBS[verb][1])
    module.configure_parser(parser)
    try:
        args = parser.parse_args(rest)
    except SystemExit as exc:                              # --help (0) or a usage error (2)
        return exc.code if isinstance(exc.code, int) else 2
    return int(module.run_cli(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
