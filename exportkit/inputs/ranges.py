"""Integer ranges of generated inputs: `--int-range LO:HI` / `NAME=LO:HI` parsed once, resolved over what the model
or its export recorded, and written to (and read from) the manifest's golden entries."""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from exportkit.dtypes import is_string, numpy_dtype
from exportkit.errors import UsageError
from exportkit.inputs.spec import InputSpec

DEFAULT_INT_RANGE = (0, 10)
_RANGE = r"\s*(-?\d+)\s*:\s*(-?\d+)\s*"


def parse_int_range(spec: str) -> tuple[int, int]:
    """`"LO:HI"` -> (LO, HI), half-open [LO, HI), LO < HI; negative numbers allowed (`-5:5`)."""
    m = re.fullmatch(_RANGE, spec or "")
    if not m:
        raise UsageError(f"bad --int-range {spec!r}", "expected LO:HI or NAME=LO:HI with integers, e.g. --int-range "
                                                      "0:10 or --int-range token_ids=0:30522")
    lo, hi = int(m.group(1)), int(m.group(2))
    if lo >= hi:
        raise UsageError(f"bad --int-range {spec!r}: LO must be < HI (the range is [LO, HI))",
                         "e.g. --int-range 0:10")
    return lo, hi


def format_int_range(lo_hi: tuple[int, int]) -> str:
    return f"{lo_hi[0]}:{lo_hi[1]}"


@dataclass(frozen=True)
class IntRanges:
    """The values of generated integer inputs: [LO, HI) per input key, else `default`."""

    default: tuple[int, int] = DEFAULT_INT_RANGE
    by_input: dict[str, tuple[int, int]] = field(default_factory=dict)

    def of(self, key: str) -> tuple[int, int]:
        return self.by_input.get(key, self.default)

    def describe(self) -> str:
        return ", ".join(f"{k}={format_int_range(v)}" for k, v in self.by_input.items())

    def to_manifest(self) -> dict:
        """The manifest's golden entries: `int_range` (what older readers use) and `int_ranges` per input."""
        return {"int_range": format_int_range(self.default),
                "int_ranges": {k: format_int_range(v) for k, v in self.by_input.items()}}

    @classmethod
    def from_manifest(cls, golden: dict | None) -> "IntRanges":
        golden = golden or {}
        return cls(parse_int_range(golden.get("int_range") or format_int_range(DEFAULT_INT_RANGE)),
                   {k: parse_int_range(v) for k, v in (golden.get("int_ranges") or {}).items()})


def int_range_texts(value) -> list[str]:
    """--int-range values (repeatable) or exportkit.toml's int_range (a string or a list) as a list."""
    if value is None or value == "":
        return []
    return [value] if isinstance(value, str) else [str(v) for v in value]


def is_integer(dtype: str) -> bool:
    """An integer dtype name (int8 ... uint64): the inputs --int-range and derived ranges apply to."""
    try:
        return not is_string(dtype) and numpy_dtype(dtype).kind in "iu"
    except (TypeError, ValueError, KeyError):
        return False


def integer_keys(specs: list[InputSpec]) -> list[str]:
    """The inputs that hold integers (serialized Examples are strings, their features follow the default)."""
    return [s.key for s in specs if s.examples is None and is_integer(s.dtype)]


@dataclass(frozen=True)
class IntRangeFlags:
    """--int-range values, parsed once where the options are read: the plain `LO:HI` (every integer input) or
    None, and {NAME: range} of the `NAME=LO:HI` ones."""

    plain: tuple[int, int] | None = None
    named: dict[str, tuple[int, int]] = field(default_factory=dict)


def parse_int_range_flags(texts) -> IntRangeFlags:
    """--int-range values (a list, or exportkit.toml's string or list) -> IntRangeFlags; the last wins."""
    plain, named = None, {}
    for text in int_range_texts(texts):
        name, sep, lo_hi = text.partition("=") if "=" in text else ("", "", text)
        if sep and not name.strip():
            raise UsageError(f"bad --int-range {text!r}: no input name before '='", "write NAME=LO:HI")
        if sep:
            named[name.strip()] = parse_int_range(lo_hi)
        else:
            plain = parse_int_range(lo_hi)
    return IntRangeFlags(plain, named)


def resolve_int_ranges(flags: IntRangeFlags, integer_keys: list[str], found: IntRanges | None = None) -> IntRanges:
    """--int-range values over what is `found` (derived from the model, or recorded by export): `NAME=LO:HI` sets
    one input, a plain `LO:HI` every integer input without its own; nothing given keeps what was found. Every
    integer input gets its range by name (so that the manifest records each)."""
    plain, named = flags.plain, flags.named
    unknown = sorted(set(named) - set(integer_keys))
    if unknown:
        raise UsageError(f"--int-range names {', '.join(unknown)}, which {'is' if len(unknown) == 1 else 'are'} not "
                         f"an integer input", "integer inputs: " + (", ".join(integer_keys) or "none"))
    found = found or IntRanges()
    default = plain or found.default
    return IntRanges(default, {key: named.get(key) or plain or found.by_input.get(key) or default
                               for key in integer_keys})


def recorded_int_ranges(flags: IntRangeFlags, manifest, signatures: dict, derived: dict | None = None) -> IntRanges:
    """The ranges a SavedModel's inputs are generated from (verify, compat --run, inspect --requests): what its
    export recorded (`manifest`: an exportkit.savedmodel.manifest.Manifest, or None), else the ranges `derived`
    from its graph (exportkit.savedmodel.int_ranges), else the default, with --int-range over them. `signatures`: in
    savedmodel.signatures_of's form."""
    keys = sorted({key for signature in signatures.values() for key, info in signature.get("inputs", {}).items()
                   if is_integer(info.get("dtype") or "")})
    golden = manifest.golden if manifest else None
    found = IntRanges.from_manifest(golden) if golden else IntRanges(by_input=dict(derived or {}))
    return resolve_int_ranges(flags, keys, found)
