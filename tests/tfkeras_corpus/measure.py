"""How much of the tf.keras 2 corpus exports and verifies as a user would run it (issue 30).

    .venv/bin/python -m tests.tfkeras_corpus.measure [--keep DIR] [--only NAME,...] [--flavours tf2x,tfkeras,tf212]

Builds the corpus (tests/tfkeras_corpus/builders.py: one training process per flavour, one for the ecosystem's
SavedModels) and runs each entry's commands in a subprocess of this Python's exportkit, in the entry's environment:
`export SRC -o OUT [flags]`, `verify OUT --against SRC [flags]`, `inspect SRC [flags]`, `compat OUT --tf 2.21 --run`
and, for an entry with `missing`, the export without its --custom-objects (exit 2 naming the class, then the fix
line's flag). The ecosystem's SavedModels get verify, inspect and compat (--tf 2.12,2.21 --run when the TF 2.12
environment is installed). Prints one line per entry (ok/FAIL per command, `-` where it did not run) and the total.
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.corpus.measure import _last_lines as said  # "exit N: " and the last lines a command printed
from tests.tfkeras_corpus.builders import (FLAVOURS, TF212_PYTHON, Built, available_flavours, build_all,
                                           build_ecosystem, user_env)


def exportkit(args: list[str], env: dict | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
    """`python -m exportkit ARGS` as a user runs it (default: builders.user_env())."""
    return subprocess.run([sys.executable, "-m", "exportkit", *map(str, args)], capture_output=True, text=True,
                          env=user_env() if env is None else env, timeout=timeout)


def error_findings(proc: subprocess.CompletedProcess) -> list[str]:
    """`inspect --json`'s findings of severity error (the command's own failure when it did not exit 0)."""
    if proc.returncode != 0:
        return [said(proc)]
    return [f"{f['code']}: {f['message']}" for f in json.loads(proc.stdout).get("findings", [])
            if f.get("severity") == "error"]


def fix_line(stderr: str) -> str:
    return next((line.strip() for line in stderr.splitlines() if line.strip().startswith("fix:")), "")


def proposed_module(fix: str) -> str | None:
    """The module (or module:Name) a fix line's `--custom-objects` names; None for a placeholder (MODULE, <module>)."""
    found = re.search(r"--custom-objects[ =]([a-z_]\w*(?:\.\w+)*(?::\w+)?)", fix)
    return found.group(1) if found else None


def missing_verdict(built: Built, out: Path, own_export_ok: bool) -> tuple[bool, str]:
    """The export without --custom-objects: exit 2 naming the class (no traceback) and a fix line that leads
    somewhere: the module it names then exports. A .keras records the module, so its fix must name it; an .h5
    records none, so a placeholder will do, and the user's own module then exports. A fix naming the entry's own
    module is judged by the entry's own export (`own_export_ok`: the same command)."""
    refused = exportkit(built.export_args(out, drop_custom_objects=True), built.env())
    fix = fix_line(refused.stderr)
    named = built.entry.missing in refused.stderr and "--custom-objects" in fix
    if refused.returncode != 2 or not named or "Traceback" in refused.stderr:
        return False, said(refused)
    module = proposed_module(fix)
    if module is None and built.entry.format == "keras":
        return False, f"the fix names no module, although the .keras records it: {fix}"
    own = built.entry.flags[built.entry.flags.index("--custom-objects") + 1]
    if module in (None, own):
        return own_export_ok, f"{fix} -> --custom-objects {own}: the entry's own export"
    fixed = exportkit(built.export_args(out, drop_custom_objects=True) + ["--custom-objects", module], built.env())
    return fixed.returncode == 0, f"{fix} -> --custom-objects {module}: {said(fixed)}"


def entry_verdicts(built: Built, work: Path) -> dict[str, tuple[bool, str]]:
    """{command: (as expected, what exportkit said)} for every command the entry is judged by."""
    out, env = work / built.entry.name, built.env()
    export = exportkit(built.export_args(out), env)
    results = {"export": (export.returncode == 0, said(export))}
    verify = exportkit(built.verify_args(out), env) if export.returncode == 0 else None
    results["verify"] = (verify.returncode == 0, said(verify)) if verify else (False, "no export to verify")
    errors = error_findings(exportkit(["inspect", *built.source_args(), "--json"], env))
    results["inspect"] = (not errors, "; ".join(errors) or "no error findings")
    compat = exportkit(["compat", out, "--tf", "2.21", "--run"], env) if export.returncode == 0 else None
    results["compat"] = (compat.returncode == 0, said(compat)) if compat else (False, "no export to check")
    if built.entry.missing:
        results["missing"] = missing_verdict(built, work / f"{built.entry.name}_missing", export.returncode == 0)
    return results


def compat_versions() -> str:
    return "2.12,2.21" if TF212_PYTHON.exists() else "2.21"


def ecosystem_verdicts(base: Path) -> dict[str, tuple[bool | None, str]]:
    """TF Serving serves each of them: verify, inspect and compat --run say so."""
    verify = exportkit(["verify", base])
    errors = error_findings(exportkit(["inspect", base, "--json"]))
    compat = exportkit(["compat", base, "--tf", compat_versions(), "--run"])
    return {"verify": (verify.returncode == 0, said(verify)),
            "inspect": (not errors, "; ".join(errors) or "no error findings"),
            "compat": (compat.returncode == 0, said(compat))}


COLUMNS = ("export", "verify", "inspect", "compat", "missing")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", help="build the corpus and the exports here (kept) instead of a temporary directory")
    parser.add_argument("--only", help="comma-separated entry names (ecosystem names too)")
    parser.add_argument("--flavours", help=f"comma-separated, of {', '.join(FLAVOURS)} (default: every available)")
    parser.add_argument("--no-ecosystem", action="store_true", help="skip the ecosystem's SavedModels")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="print each entry's export command line and what exportkit said for every command")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tfkeras-corpus-") as tmp:
        root = Path(args.keep or tmp)
        root.mkdir(parents=True, exist_ok=True)
        only = set(args.only.split(",")) if args.only else None
        flavours = args.flavours.split(",") if args.flavours else available_flavours()
        entries = [b for b in build_all(root / "corpus", flavours) if only is None or b.entry.name in only]
        ecosystem = {} if args.no_ecosystem else build_ecosystem(root / "corpus")
        ecosystem = {n: p for n, p in ecosystem.items() if only is None or n in only}
        print(f"{'':4} {'entry':<34} {'format':<10} {'keras':<5} " + " ".join(f"{c:<8}" for c in COLUMNS))
        agree = total = whole = 0
        rows = [(b.entry.name, b.entry.format, b.entry.keras, b.command_line(root / "exports" / b.entry.name),
                 lambda b=b: entry_verdicts(b, root / "exports")) for b in entries]
        rows += [(n, "savedmodel", "eco", f"exportkit verify {p}", lambda p=p: ecosystem_verdicts(p))
                 for n, p in ecosystem.items()]
        for name, fmt, keras, command_line, verdicts in rows:
            results = verdicts()
            ok = [c for c, (good, _) in results.items() if good]
            agree, total, whole = agree + len(ok), total + len(results), whole + (len(ok) == len(results))
            cells = " ".join(f"{'-' if c not in results else 'ok' if results[c][0] else 'FAIL':<8}" for c in COLUMNS)
            print(f"{'ok  ' if len(ok) == len(results) else 'FAIL'} {name:<34} {fmt:<10} {keras:<5} {cells}")
            if args.verbose:
                print(f"       $ {command_line}")
            for command, (good, what) in results.items():
                if args.verbose or not good:
                    print(f"       {command}: {what[:400]}")
            sys.stdout.flush()
        print(f"\n{whole} of {len(rows)} entries give every expected verdict; {agree} of {total} command verdicts "
              f"as expected")
    return 0


if __name__ == "__main__":
    sys.exit(main())
