"""The `exportkit` command. `exportkit verify` starts its TensorFlow worker before the CLI's own imports (~0.4 s):
the worker's TensorFlow import (2-3 s, the longest step of a verify) then overlaps them too. The worker loads nothing
until verify has read and planned the model; one this run does not use (another device in exportkit.toml, a plan
without it) is ended before verify returns (TfWorker.discard_prestarted)."""
import sys


def main() -> None:
    from exportkit.files import reopen_closed_stdio

    closed = reopen_closed_stdio()  # first: the worker's pipes must not take a closed stdout's fd 1
    if needs_worker(sys.argv):
        from exportkit.runtimes.session import TfWorker

        TfWorker.prestart("cpu")
    from exportkit.cli import main as cli

    cli(closed)


def needs_worker(argv: list[str]) -> bool:
    """Whether `exportkit ARGV` is a verify whose runtimes run in this Python's TensorFlow worker. No --runtimes: all
    of them, `session` among them. A run that needs none (`--runtimes serving --serving docker`, `--runtimes
    keras,saved_model`) starts none: a TensorFlow import killed halfway only takes a core from the run."""
    if argv[1:2] != ["verify"] or {"-h", "--help", "--data", "--device"} & set(argv):
        return False
    from exportkit.runtimes.session import runs_in_worker

    runtimes = _flag(argv, "--runtimes")
    return runtimes is None or runs_in_worker(runtimes.split(","), _flag(argv, "--serving"))


def _flag(argv: list[str], name: str) -> str | None:
    """The value of `name VALUE` or `name=VALUE` in argv (the last one given), or None."""
    value = None
    for flag, following in zip(argv, argv[1:] + [""]):
        if flag == name:
            value = following
        elif flag.startswith(name + "="):
            value = flag.split("=", 1)[1]
    return value
