"""How many corpus models get the real server's verdict from `inspect`, `verify` and `compat --run`.

    .venv/bin/python -m tests.corpus.measure [--keep DIR] [--tf 2.21] [--only NAME,...]

Builds the corpus (tests/corpus/builders.py) into a temporary directory, runs each command as a user would (a
subprocess of this Python's exportkit), and prints one line per model and command: `ok` when exportkit's verdict is
the server's (exit 0 for a model TF Serving serves; a non-zero exit that names the reason for one it refuses;
for compat --run, which loads and runs the model, exit 0 when TF Serving loads it and only an API refuses it).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.corpus.builders import BUILDERS, CorpusModel, write_in_env


def exportkit(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONWARNINGS="ignore")
    return subprocess.run([sys.executable, "-m", "exportkit", *args], capture_output=True, text=True, env=env,
                          timeout=timeout)


def first_signature(model: CorpusModel) -> str:
    apis = model.expected.apis
    return "serving_default" if "serving_default" in apis or not apis else sorted(apis)[0]


def verdicts(model: CorpusModel, tf: str) -> dict[str, tuple[bool, str]]:
    """{command: (agrees with TF Serving, one line of what exportkit said)}."""
    path = str(model.base)
    results = {}
    inspect = exportkit("inspect", path, "--json")
    errors = []
    if inspect.returncode == 0:
        findings = json.loads(inspect.stdout).get("findings", [])
        errors = [f"{f['code']}: {f['message']}" for f in findings if f.get("severity") == "error"]
    said = inspect.stderr.strip() or "; ".join(errors) or "no error findings"
    results["inspect"] = (inspect.returncode == 0 and not errors, said)
    verify = exportkit("verify", path)
    results["verify"] = (verify.returncode == 0, _last_lines(verify))
    compat = exportkit("compat", path, "--tf", tf, "--run", "--signature-name", first_signature(model))
    results["compat"] = (compat.returncode == 0, _last_lines(compat))
    if not model.expected.serves:  # compat --run loads and runs (Predict's path): it refuses what does not load
        word = model.expected.refusal.lower()
        results = {k: (ok if k == "compat" and model.expected.loaded else not ok and word in said.lower(), said)
                   for k, (ok, said) in results.items()}
    return results


def _last_lines(proc: subprocess.CompletedProcess, n: int = 3) -> str:
    text = (proc.stdout + "\n" + proc.stderr).strip().splitlines()
    return f"exit {proc.returncode}: " + " | ".join(line.strip() for line in text[-n:])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", help="build the corpus here (kept) instead of a temporary directory")
    parser.add_argument("--tf", default="2.21", help="TensorFlow versions for compat --run (default 2.21)")
    parser.add_argument("--only", help="comma-separated model names")
    parser.add_argument("--old-tf-python", help="also write models with this interpreter (a managed environment's)")
    parser.add_argument("-v", "--verbose", action="store_true", help="print what exportkit said")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.keep or tmp)
        root.mkdir(parents=True, exist_ok=True)
        models = [builder(root) for builder in BUILDERS]
        if args.old_tf_python:
            models += write_in_env(args.old_tf_python, root / "old")
        if args.only:
            models = [m for m in models if m.name in args.only.split(",")]
        agree = total = 0
        per_model = 0
        for model in models:
            results = verdicts(model, args.tf)
            for command, (ok, said) in results.items():
                total += 1
                agree += ok
                detail = f" {said[:300]}" if args.verbose or not ok else ""
                print(f"{'ok  ' if ok else 'FAIL'} {model.name:<36} {command:<8}{detail}")
            per_model += all(ok for ok, _ in results.values())
            sys.stdout.flush()
        print(f"\n{per_model} of {len(models)} models: every command gives TF Serving's verdict; "
              f"{agree} of {total} command verdicts agree")
    return 0


if __name__ == "__main__":
    sys.exit(main())
