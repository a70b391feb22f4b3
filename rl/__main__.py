"""`python -m rl train ...` (= python -m rl.train), `python -m rl policy ...` (= python -m rl.policy) and
`python -m rl experiment ...` (= python -m rl.experiment)."""
import sys


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in ("train", "policy", "experiment"):
        print("usage: python -m rl {train,policy,experiment} ...  (see python -m rl.train --help, "
              "python -m rl.policy --help, python -m rl.experiment --help)", file=sys.stderr)
        return 2
    if argv[0] == "train":
        from .train import main as train_main
        return train_main(argv[1:])
    if argv[0] == "experiment":
        from .experiment.cli import main as experiment_main
        return experiment_main(argv[1:])
    from .policy import main as policy_main
    return policy_main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
