"""python -m cudal2.templates [FAMILY] [-D NAME=VALUE ...]: print the .cu file a config makes."""
import argparse
import sys

from cudal2.templates.cli import configure_parser, run_cli


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cudal2.templates",
                                     description="Print the self-contained .cu file a template config instantiates.")
    configure_parser(parser)
    return run_cli(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
