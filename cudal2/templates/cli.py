"""`cudal2 templates` / `python -m cudal2.templates`: print the .cu file a config makes, list the
families, write their default configs, rewrite the kernel table's untuned seed rows, or build a
family's whole space and record the compile checks per config (--build-space)."""
from __future__ import annotations

import sys
from pathlib import Path

from cudal2.templates import FAMILIES, Value, instantiate
from cudal2.templates.buildspace import run_build_space
from cudal2.templates.seeds import write_seeds


def configure_parser(parser) -> None:
    parser.add_argument("family", nargs="?", default="mma",
                        help=f"family to instantiate ({', '.join(FAMILIES)}; default mma)")
    parser.add_argument("-D", "--set", dest="sets", action="append", default=[], metavar="NAME=VALUE",
                        help="change a parameter of the family's default config (repeatable), e.g. -D BM=64 -D ACC=f16")
    parser.add_argument("--default", type=int, default=0, metavar="I",
                        help="start from the family's I-th default config (see --list)")
    parser.add_argument("--short", action="store_true",
                        help="print the #define lines + #include form instead of the inlined file")
    parser.add_argument("--list", action="store_true",
                        help="list families, their default configs and parameter choices, then exit")
    parser.add_argument("-o", "--out", type=Path, default=None, metavar="FILE",
                        help="write the .cu file here instead of stdout")
    parser.add_argument("--seed-store", nargs="?", const="", default=None, metavar="DIR",
                        help="rewrite the untuned seed rows of a generated_kernels/ store (default: "
                             "CUDAL2_KERNELS) from the current templates, then exit")
    parser.add_argument("--defaults", type=Path, default=None, metavar="DIR",
                        help="write every family's default configs as DIR/<config name>.cu, then exit "
                             "(the reference kernels: `cudal2 build DIR/*.cu --arch sm_90a`)")
    parser.add_argument("--build-space", nargs="+", default=None, metavar="FAMILY",
                        help="build every valid config of each FAMILY's space for every arch it "
                             "claims (or --arch), CUDAL2_BUILD_JOBS at a time through the build cache, "
                             "write one row per (config, arch) to --csv (ok, registers, spills, stack, "
                             "shared memory, the claimed tensor-core instruction in the SASS, "
                             "Memset/Memcpy imports) and exit 1 if any row is bad")
    parser.add_argument("--arch", default=None, metavar="ARCH",
                        help="with --build-space: only this arch (each family must claim it)")
    parser.add_argument("--where", action="append", default=[], metavar="NAME=VALUE",
                        help="with --build-space: only the configs with this parameter value (repeatable)")
    parser.add_argument("--csv", type=Path, default=None, metavar="OUT.csv",
                        help="with --build-space: the CSV to write (required)")


def _parse_value(text: str) -> Value:
    try:
        return int(text, 0)
    except ValueError:
        return text


def _parse_assignments(items: list[str], flag: str) -> dict[str, Value] | None:
    """NAME=VALUE arguments -> {NAME: value}; None (after naming the bad one) when one is malformed."""
    out: dict[str, Value] = {}
    for s in items:
        name, eq, value = s.partition("=")
        if not eq or not name.strip():
            print(f"error: {flag} {s!r}: expected NAME=VALUE", file=sys.stderr)
            return None
        out[name.strip()] = _parse_value(value.strip())
    return out


def _write_defaults(folder: Path) -> int:
    folder.mkdir(parents=True, exist_ok=True)
    print(f"writing the default configs of {', '.join(FAMILIES)} to {folder}", file=sys.stderr)
    for fam in FAMILIES.values():
        for cfg in fam.defaults():
            path = folder / f"{cfg.name()}.cu"
            path.write_text(instantiate(cfg))
            print(f"{path}  {cfg.label()}  (arches {' '.join(fam.arches)})")
    return 0


def run_cli(args) -> int:
    if getattr(args, "build_space", None) is not None:
        if args.csv is None:
            print("error: --build-space needs --csv OUT.csv", file=sys.stderr)
            return 2
        where = _parse_assignments(args.where, "--where")
        if where is None:
            return 2
        return run_build_space(args.build_space, args.arch, args.csv, where=where)
    if getattr(args, "arch", None) is not None or getattr(args, "csv", None) is not None or getattr(args, "where", None):
        print("error: --arch, --where and --csv go with --build-space", file=sys.stderr)
        return 2
    if getattr(args, "seed_store", None) is not None:
        print(f"wrote {write_seeds(args.seed_store or None)}")
        return 0
    if args.defaults is not None:
        return _write_defaults(args.defaults)
    if args.list:
        for fam in FAMILIES.values():
            print(f"{fam.name}  ({fam.header}, style {fam.style}, arches {', '.join(fam.arches)})")
            print(f"    {fam.description}")
            for i, c in enumerate(fam.defaults()):
                print(f"    default {i}: {c.label()}")
            for k, v in fam.choices().items():
                print(f"    {k}: {', '.join(map(str, v))}")
        return 0
    if args.family not in FAMILIES:
        print(f"error: unknown family {args.family!r}; known: {', '.join(FAMILIES)}", file=sys.stderr)
        return 2
    fam = FAMILIES[args.family]
    defaults = fam.defaults()
    if not 0 <= args.default < len(defaults):
        print(f"error: --default {args.default}: {fam.name} has {len(defaults)} default configs",
              file=sys.stderr)
        return 2
    cfg = defaults[args.default]
    changes = _parse_assignments(args.sets, "-D")
    if changes is None:
        return 2
    try:
        cfg = cfg.with_(**changes)
        text = fam.short_source(cfg) if args.short else instantiate(cfg)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.out is None:
        sys.stdout.write(text)
    else:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    print(f"// {cfg.label()}: {len(text.splitlines())} lines written to {args.out or 'stdout'}",
          file=sys.stderr)
    return 0
