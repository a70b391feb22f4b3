"""`cudal2 templates --explain CONFIG --shape MxNxK`: a budgeted config's budget at a shape
(cudal2.templates.budget: the streaming families and the tile grids), for every runtime option
the planner would sweep there (a decode row's wider sweep where the family has one) or the ones
given.

CONFIG is a config label (`skinny:BK=64,BM=16,...`, as `cudal2 templates --list` and the
campaign's pack print it) or a family name (its first default), changed by `-D NAME=VALUE`.
Registers come from ptxas with `--build` (nvcc, no GPU), else the family's estimate (said so).
"""
from __future__ import annotations

import argparse
import sys

from cudal2.core.devices import GPUS, gpu_for
from cudal2.templates.budget import BUDGETED, budget, is_decode
from cudal2.templates.family import FAMILIES, KernelConfig


def parse_config(text: str, sets: list[str]) -> KernelConfig:
    """A config from a label or a family name, with NAME=VALUE changes; ValueError naming the
    problem."""
    family, _, rest = text.partition(":")
    if family not in FAMILIES:
        raise ValueError(f"config {text!r}: unknown family {family!r} (known: {', '.join(FAMILIES)})")
    # the family's first default under the label: a label from before a parameter existed
    # (skinny's A_LOAD) is the build it named, which ran the default
    cfg = FAMILIES[family].default()
    for item in [p for p in rest.split(",") if p] + list(sets):
        name, eq, value = item.partition("=")
        if not eq:
            raise ValueError(f"config {text!r}: {item!r} is not NAME=VALUE")
        cfg = cfg.with_(**{name.strip(): int(value) if value.strip().lstrip("-").isdigit() else value.strip()})
    fam = FAMILIES[family]
    if not any(fam.valid(cfg, a) for a in fam.arches):   # one arch is enough (a deep ring: sm_90a)
        raise ValueError(f"config {cfg.label()}: " + "; ".join(fam.problems(cfg)))
    return cfg


def parse_shape(text: str) -> tuple[int, int, int]:
    try:
        M, N, K = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise ValueError(f"--shape {text!r}: expected MxNxK, e.g. 1x4096x4096") from None
    if min(M, N, K) <= 0:
        raise ValueError(f"--shape {text!r}: sizes must be positive")
    return M, N, K


def parse_options(items: list[str]) -> dict[str, int]:
    out = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not eq or not value.strip().isdigit():
            raise ValueError(f"--option {item!r}: expected NAME=INT, e.g. splits=4")
        out[name.strip()] = int(value)
    return out


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help=f"a config label or a family name ({', '.join(BUDGETED)})")
    parser.add_argument("--shape", required=True, help="MxNxK")
    parser.add_argument("-D", "--set", dest="sets", action="append", default=[], metavar="NAME=VALUE",
                        help="change a parameter of the config (repeatable)")
    parser.add_argument("--option", action="append", default=[], metavar="NAME=INT",
                        help="one runtime option combination (repeatable options; default: every "
                             "combination the build accepts)")
    parser.add_argument("--gpu", default="H200", help=f"the device's figures ({', '.join(GPUS)}; default H200)")
    parser.add_argument("--arch", default="sm_90a", help="the arch to build for with --build (default sm_90a)")
    parser.add_argument("--build", action="store_true", help="build the config (nvcc) and use ptxas's registers")


def run_cli(args) -> int:
    cfg = parse_config(args.config, args.sets)
    if cfg.family not in BUDGETED:
        raise ValueError(f"config {cfg.label()}: the streaming budget models {', '.join(BUDGETED)}")
    shape, gpu = parse_shape(args.shape), gpu_for(gpu=args.gpu)
    fam = FAMILIES[cfg.family]
    if not fam.serves(cfg, *shape):
        raise ValueError(f"config {cfg.label()} does not serve {args.shape}")
    registers = 0
    if args.build:
        from cudal2.core.build import build
        result = build(fam.build_spec(cfg, args.arch))
        if not result.ok:
            raise ValueError(f"config {cfg.label()} failed to build for {args.arch}: {result.status}")
        registers = result.max_registers
    combos = ([parse_options(args.option)] if args.option
              else fam.option_space(cfg, decode=is_decode(cfg.family, *shape)))
    met = 0
    for options in combos:
        b = budget(cfg, shape, gpu, options=options, registers=registers)
        met += not b.problems()
        print("\n".join(b.lines()))
    print(f"{met} of {len(combos)} option combination(s) meet the budget", file=sys.stderr)
    return 0
