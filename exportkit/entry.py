"""The `exportkit` command. `exportkit verify` starts its TensorFlow worker before the CLI's own imports (~0.4 s):
the worker's TensorFlow import (2-3 s, the longest step of a verify) then overlaps them too. The worker loads nothing
until verify has read and planned the model; one this run does not use (another device in exportkit.toml, a plan
without it) is ended before verify returns (TfWorker.discard_prestarted)."""
import sys


def main() -> None:
    if sys.argv[1:2] == ["verify"] and not {"-h", "--help", "--data", "--device"} & set(sys.argv) and \
            _local_runtimes(sys.argv):
        from exportkit.runtimes.session import TfWorker

        TfWorker.prestart("cpu")
    from exportkit.cli import main as cli

    cli()


def _local_runtimes(argv: list[str]) -> bool:
    """Whether the runtimes asked for (all by default) include one of this Python's worker (`--runtimes golden
    --tf 2.12` does not: only a managed environment's worker runs, and verify prestarts that one)."""
    for flag, value in zip(argv, argv[1:] + [""]):
        if flag.startswith("--runtimes="):
            flag, value = "--runtimes", flag.split("=", 1)[1]
        if flag == "--runtimes" and not {"saved_model", "session", "serving", "rest"} & set(value.split(",")):
            return False
    return True
