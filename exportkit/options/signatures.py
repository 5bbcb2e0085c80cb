"""The signatures an export writes, as named by `--signature NAME:key=value,...` or `[signatures.NAME]` tables:
checked here for everything that needs no model (exportkit/export/signature.py resolves them against it)."""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from exportkit.errors import UsageError

METHODS = ("predict", "classify", "regress")
INPUT_KINDS = ("tensors", "examples")
_SIGNATURE_KEYS = ("outputs", "input", "method", "scores", "classes")
_SIGNATURE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_./-]*")


@dataclass
class SignatureSpec:
    """One named signature of an export (`--signature NAME:key=value,...` or `[signatures.NAME]`).

    Only what can be checked without the model is checked here; outputs are checked against the model later.
    """

    name: str
    outputs: list[str] | None = None  # model output keys (a subset); None = all
    input: str = "tensors"  # tensors | examples (one string tensor of serialized tf.Example)
    method: str = "predict"  # predict | classify | regress
    scores: str | None = None  # classify: the model output that holds the class scores
    classes: str | None = None  # classify: label file, one class per line, shipped as an asset


def _signature_error(where: str, problem: str, fix: str) -> UsageError:
    return UsageError(f"{where}: {problem}", fix)


def signature_spec(name: str, values: dict, where: str) -> SignatureSpec:
    """A SignatureSpec from `key: value` pairs (CLI or TOML), checked for what needs no model."""
    if not _SIGNATURE_NAME.fullmatch(name or ""):
        raise _signature_error(where, f"bad signature name {name!r}",
                               "use letters, digits and _ . / - (e.g. --signature embed:outputs=embedding)")
    unknown = sorted(set(values) - set(_SIGNATURE_KEYS))
    if unknown:
        raise _signature_error(where, f"unknown key(s) {', '.join(unknown)}", f"use only: {', '.join(_SIGNATURE_KEYS)}")
    outputs = values.get("outputs")
    if isinstance(outputs, str):
        outputs = [o.strip() for o in outputs.split("+") if o.strip()]
    if outputs is not None and (not isinstance(outputs, list) or not outputs):
        raise _signature_error(where, "outputs must name at least one model output", "write outputs=a+b")
    spec = SignatureSpec(name=name, outputs=outputs, input=str(values.get("input", "tensors")),
                         method=str(values.get("method", "predict")), scores=values.get("scores"),
                         classes=values.get("classes"))
    if spec.input not in INPUT_KINDS:
        raise _signature_error(where, f"input={spec.input} is not tensors or examples", "write input=tensors or input=examples")
    if spec.method not in METHODS:
        raise _signature_error(where, f"method={spec.method} is not predict, classify or regress",
                               "write method=predict, method=classify or method=regress")
    if spec.method in ("classify", "regress") and spec.input != "examples":
        raise _signature_error(where, f"a {spec.method} signature takes serialized tf.Example (TF Serving's "
                                      f"{spec.method.capitalize()} API sends Examples), but input={spec.input}",
                               f"add input=examples to signature '{name}'")
    if spec.method != "classify" and (spec.scores or spec.classes):
        raise _signature_error(where, "scores= and classes= belong to classify signatures",
                               f"add method=classify to signature '{name}', or drop scores=/classes=")
    if spec.method == "classify" and outputs is not None:
        raise _signature_error(where, "a classify signature names its outputs scores and classes, not outputs=",
                               "write scores=MODEL_OUTPUT (and classes=labels.txt)")
    if spec.method == "regress" and outputs is not None and len(outputs) != 1:
        raise _signature_error(where, f"a regress signature has one output, got outputs={'+'.join(outputs)}",
                               "name one model output: outputs=OUTPUT")
    if spec.classes is not None and not Path(spec.classes).is_file():
        raise _signature_error(where, f"classes file {spec.classes} does not exist",
                               "pass a text file with one class label per line: classes=labels.txt")
    return spec


def parse_signature_arg(text: str) -> SignatureSpec:
    """`NAME[:key=value[,key=value...]]`, e.g. `embed:outputs=embedding` or `cls:input=examples,method=classify`."""
    name, _, rest = text.partition(":")
    values = {}
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--signature {text!r}: {item!r} is not key=value",
                             "write --signature NAME:outputs=a+b,input=examples,method=predict")
        if key.strip() in values:
            raise UsageError(f"--signature {text!r}: {key.strip()}= is given twice",
                             f"give each key once (several outputs: {key.strip()}=a+b)")
        values[key.strip()] = value.strip()
    return signature_spec(name.strip(), values, f"--signature {text!r}")


def merge_signatures(flags: list[SignatureSpec], table: list[SignatureSpec]) -> list[SignatureSpec]:
    """exportkit.toml's signatures, each replaced by a flag of the same name, then the other flags; names unique."""
    seen = set()
    for spec in flags:
        if spec.name in seen:
            raise UsageError(f"--signature {spec.name} is given twice", "give each signature a unique name")
        seen.add(spec.name)
    by_name = {spec.name: spec for spec in flags}
    merged = [by_name.pop(spec.name, spec) for spec in table]
    return merged + [spec for spec in flags if spec.name in by_name]
