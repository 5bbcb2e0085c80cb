"""Every float32 through the REST client's fixed-width numbers and back, as TF Serving reads them: the proof that a
float32 input reaches the server's tensor bit for bit (docs/performance.md, "REST").

    python benchmarks/rest_exact.py [--block 16] [--first 0 --last 0xffffffff]

For every bit pattern (finite ones; NaN and Inf go the json.dumps way), json_tensor.fixed_words writes its text and
json_tensor's reader turns the text into the double rapidjson's StrtodNormalPrecision gives (the server's fast path;
tests/test_serving_rest_conformance.py checks that reader against python-rapidjson itself), then GetFloat()'s cast to float32;
the result must have the same bits. Also checked for every pattern: the text has 9 significant digits within 0.51
units of the 9th of the float32's exact value (the margin the proof rests on). 2**32 patterns take ~10 minutes of one
core; --first/--last check a range.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from exportkit.serving.json.fixed import fixed_words, read_fixed_words


def check(first: int, last: int, block: int) -> int:
    bad = checked = 0
    started = time.monotonic()
    for low in range(first, last + 1, block):
        bits = np.arange(low, min(low + block, last + 1), dtype=np.uint64).astype(np.uint32)
        values = bits.view(np.float32)
        values = values[np.isfinite(values)]
        words = fixed_words(values)
        back = read_fixed_words(words)
        if back is None:
            raise SystemExit(f"rest_exact: numbers the reader refuses in [{low:#x}, {low + block:#x})")
        wrong = back.astype(np.float32).view(np.uint32) != values.view(np.uint32)
        # the margin: |decimal - value| <= 0.51 units of the decimal's 9th digit
        exact = values.astype(np.float64)
        unit = np.abs(back) / np.where(back != 0, _significand(words), 1)
        far = np.abs(back - exact) > 0.51 * unit * (1 + 2 ** -50)
        bad += int(wrong.sum() + far.sum())
        if wrong.any() or far.any():
            index = np.flatnonzero(wrong | far)[0]
            print(f"  {values[index]!r} ({values.view(np.uint32)[index]:#010x}) -> {words[index].tobytes()[:15]!r}")
        checked += len(values)
        if (low - first) % (1 << 28) == 0 and low > first:
            print(f"  {low:#010x}: {checked} checked, {bad} wrong, {time.monotonic() - started:.0f} s", flush=True)
    print(f"rest_exact: {checked} finite float32 patterns in [{first:#x}, {last:#x}], {bad} wrong, "
          f"{time.monotonic() - started:.0f} s")
    return 1 if bad else 0


def _significand(words: np.ndarray) -> np.ndarray:
    """The 9 digits as an integer (so value / it = one unit of the 9th digit)."""
    text = words.view(np.uint8).reshape(-1, 16)[:, [1, 3, 4, 5, 6, 7, 8, 9, 10]].astype(np.int64) - ord("0")
    return text @ (10 ** np.arange(8, -1, -1, dtype=np.int64))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--block", type=int, default=16, help="log2 of the patterns per step")
    parser.add_argument("--first", type=lambda s: int(s, 0), default=0)
    parser.add_argument("--last", type=lambda s: int(s, 0), default=2 ** 32 - 1)
    args = parser.parse_args()
    return check(args.first, args.last, 1 << args.block)


if __name__ == "__main__":
    raise SystemExit(main())
