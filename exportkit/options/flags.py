"""What the options of every command share: flags given as keyword arguments (the Python API's, named after the
CLI's flags) checked the same way, whichever face gave them."""
from __future__ import annotations

import math
import os

from exportkit.errors import UsageError
from exportkit.report.format import parse_size

# Report files are written by the CLI from its flags; in the Python API they are the reports' methods.
REPORT_FILES = ("json", "junit", "html", "summary")


def listed(value) -> list:
    """A repeatable flag's value: None -> [], one string -> [it]."""
    if value is None:
        return []
    return [value] if isinstance(value, (str, os.PathLike)) else list(value)


def texts(value) -> list[str]:
    """A repeatable flag's values as strings (paths and numbers are accepted where the CLI takes text)."""
    return [str(v) for v in listed(value)]


def refuse_unknown(command: str, given, known) -> None:
    """A keyword the command's flags do not have is bad usage, named with the ones it has."""
    bad = sorted(set(given) - set(known))
    if bad:
        raise UsageError(f"exportkit.{command}() has no option {', '.join(bad)}",
                         f"pass the CLI's flags as keyword arguments (`exportkit {command} --help`): "
                         f"{', '.join(sorted(known))}")


def check_tolerances(atol: float | None, rtol: float | None) -> None:
    """--atol/--rtol: finite and >= 0 (NaN compares false everywhere and -inf made the search for the required
    tolerance spin): a UsageError naming the flag."""
    for flag, value in (("--atol", atol), ("--rtol", rtol)):
        if value is not None and not (math.isfinite(value) and value >= 0):
            raise UsageError(f"{flag} {value} must be a finite number >= 0",
                             f"pass {flag} 1e-5 (for example), or leave it out for the dtype's default")


def size_flag(flag: str, value) -> int | None:
    """A size flag in bytes: `512MB` (10^6), `512MiB` (2^20), GB/GiB, kB/KiB, or plain bytes."""
    if value is None:
        return None
    size = parse_size(value)
    if size is None or size <= 0:
        raise UsageError(f"{flag} {value!r} is not a size",
                         f"pass {flag} 512MB (MB = 10^6 bytes; MiB = 2^20; GB, GiB; or a number of bytes)")
    return size
