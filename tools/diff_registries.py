"""What changed between two shipped registries: new ops (and where their kernels are), new attrs, widened
allowed dtypes, kernels added for a (device, dtype). Finds real examples for the compat test corpus.

    python tools/diff_registries.py 2.12 2.21 [--op NAME ...]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from exportkit.tfversions import registry  # noqa: E402
from exportkit.savedmodel.reader import dtype_name  # noqa: E402


def _kernel_types(entry: dict, device: str) -> dict[str, set[int]]:
    """{type attr: dtypes some kernel accepts} on `device` (DEFAULT kernels included)."""
    out: dict[str, set[int]] = {}
    for constraint in entry.get("k", {}).get(device, []) + entry.get("k", {}).get("DEFAULT", []):
        for attr, types in constraint.items():
            out.setdefault(attr, set()).update(types)
    return out


def _names(types) -> str:
    return ",".join(sorted(dtype_name(t) for t in types))


def diff(old: str, new: str, only: set[str] | None = None) -> list[str]:
    a, b = registry.load(old), registry.load(new)
    lines = []
    for op in sorted(b.names()):
        if only and op not in only:
            continue
        nb, na = b.op(op), a.op(op)
        if na is None:
            devices = sorted(nb.get("k", {})) or ["no kernel"]
            lines.append(f"new-op {op} kernels={'/'.join(devices)}")
            continue
        for attr, spec in nb["a"].items():
            if attr not in na["a"]:
                lines.append(f"new-attr {op}.{attr} type={spec['t']} default={spec.get('d')!r}")
            elif "av" in spec and "av" in na["a"][attr] and spec["t"] in ("type", "list(type)"):
                added = set(spec["av"]) - set(na["a"][attr]["av"])
                if added:
                    lines.append(f"wider-dtype {op}.{attr} +{_names(added)}")
        for device in ("CPU", "GPU"):
            ka, kb = _kernel_types(na, device), _kernel_types(nb, device)
            if not ka and kb:
                lines.append(f"new-kernel {op} on {device} (none before)")
                continue
            for attr, types in kb.items():
                added = types - ka.get(attr, set())
                if added and attr in ka:
                    lines.append(f"kernel-dtype {op} {device} {attr} +{_names(added)}")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old")
    parser.add_argument("new")
    parser.add_argument("--op", action="append", help="only this op (repeatable)")
    args = parser.parse_args()
    for line in diff(args.old, args.new, set(args.op) if args.op else None):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
