"""Compare a new serving signature with a previously released one (`verify --baseline`), and the signature a
server reports with the SavedModel's (one comparison: a served signature must not differ at all).

A signature is `{"inputs": {KEY: {"dtype": "float32", "shape": [-1, 3]}}, "outputs": {...}}`, the form of
`exportkit inspect --json` signatures (extra fields are ignored; `shape: null` = unknown rank; a dim of
`null` or any negative number = unknown; `defaults`: the input keys the SignatureDef has defaults for).

`compare_signature_sets(old, new)` is the one public comparison of two signature maps (verify's baseline,
`exportkit diff`); `compare_signatures` compares one signature.

The question is: will every request that worked against the old model work against the new one, and will
clients find what they read? Findings (severity, code):

error   baseline-removed-input       an old input is gone (old requests send it; the server rejects unknown keys)
error   baseline-removed-output      an old output is gone (clients read it)
error   baseline-renamed-input       exactly one input removed and one added with the same dtype and shape
error   baseline-renamed-output      same for outputs
error   baseline-added-input         a new required input (old requests lack it; TF Serving's Predict refuses a request
                                     with fewer inputs than the signature unless it has `defaults`, predict_util.cc)
info    baseline-added-optional-input a new input with a default in the SignatureDef's `defaults` (compatible)
error   baseline-dtype-changed       an input's or output's dtype changed
error   baseline-input-shape-changed the new input shape rejects requests the old one accepted: rank changed,
                                     an unknown dim became fixed, a fixed dim changed, unknown rank became known
info    baseline-input-shape-relaxed the new input shape accepts more (a fixed dim became unknown, ...)
error   baseline-output-shape-changed an output's rank or one of its fixed dims changed
warning baseline-output-shape-relaxed an output became more general (a fixed dim became unknown, the rank unknown):
                                     clients that rely on the old fixed size may break
info    baseline-output-shape-narrowed an unknown output dim became fixed (compatible)
info    baseline-added-output        a new output (compatible)

An unchanged signature gives no findings. Across signatures (compare_signature_sets):

error   baseline-removed-signature   a released signature is gone (clients call it by name)
error   baseline-method-changed      its method changed (predict/classify/regress pick the API clients call)
info    baseline-added-signature     a new signature (compatible)

With several signatures, each finding's message names its signature.
"""
from __future__ import annotations

from exportkit.dtypes import canonical
from exportkit.findings import Finding


def _dtype(t: dict) -> str | None:
    d = t.get("dtype") if isinstance(t, dict) else None
    return None if d is None else canonical(str(d))


def _shape(t: dict) -> list[int] | None:
    s = t.get("shape") if isinstance(t, dict) else None
    if s is None:
        return None
    return [-1 if d is None or int(d) < 0 else int(d) for d in s]


def _fmt(shape: list[int] | None) -> str:
    if shape is None:
        return "<unknown rank>"
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _accepts_all(old: list[int] | None, new: list[int] | None) -> bool:
    """True if every shape matching `old` also matches `new`."""
    if new is None:
        return True
    if old is None or len(old) != len(new):
        return False
    return all(n == -1 or n == o for o, n in zip(old, new))


def _input_shape(key: str, old: list[int] | None, new: list[int] | None) -> Finding | None:
    if old == new:
        return None
    if _accepts_all(old, new):
        return Finding("info", "baseline-input-shape-relaxed",
                       f"input '{key}' shape {_fmt(old)} -> {_fmt(new)} accepts more than before (compatible)")
    why = []
    if old is None:
        why.append("the rank is now fixed")
    elif new is not None and len(old) != len(new):
        why.append(f"rank {len(old)} -> {len(new)}")
    else:
        for i, (o, n) in enumerate(zip(old, new)):
            if o == -1 and n != -1:
                why.append(f"dim {i} was any size, now must be {n}")
            elif o != n and n != -1:
                why.append(f"dim {i} {o} -> {n}")
    return Finding("error", "baseline-input-shape-changed",
                   f"input '{key}' shape {_fmt(old)} -> {_fmt(new)} rejects requests the released model accepted "
                   f"({'; '.join(why)}); keep the old shape or release under a new model name")


def _output_shape(key: str, old: list[int] | None, new: list[int] | None) -> Finding | None:
    if old == new:
        return None
    if old is not None and new is not None:
        if len(old) != len(new):
            return Finding("error", "baseline-output-shape-changed",
                           f"output '{key}' rank changed: {_fmt(old)} -> {_fmt(new)}; clients read the old shape")
        changed = [i for i, (o, n) in enumerate(zip(old, new)) if o != -1 and n != -1 and o != n]
        if changed:
            return Finding("error", "baseline-output-shape-changed",
                           f"output '{key}' shape {_fmt(old)} -> {_fmt(new)} (dim {', '.join(map(str, changed))} "
                           f"changed); clients read the old shape")
        if all(n == o or n != -1 for o, n in zip(old, new)):  # only -1 -> fixed
            return Finding("info", "baseline-output-shape-narrowed",
                           f"output '{key}' shape {_fmt(old)} -> {_fmt(new)} is more specific (compatible)")
    if old is None and new is not None:
        return Finding("info", "baseline-output-shape-narrowed",
                       f"output '{key}' shape {_fmt(old)} -> {_fmt(new)} is more specific (compatible)")
    return Finding("warning", "baseline-output-shape-relaxed",
                   f"output '{key}' shape {_fmt(old)} -> {_fmt(new)} is more general; clients relying on the old "
                   f"fixed size may break")


def _same_type(a: dict, b: dict) -> bool:
    return _dtype(a) == _dtype(b) and _shape(a) == _shape(b)


def _compare_side(side: str, old: dict, new: dict, optional: set[str] = frozenset()) -> list[Finding]:
    noun = side[:-1]  # "input" | "output"
    findings: list[Finding] = []
    removed = sorted(k for k in old if k not in new)
    added = sorted(k for k in new if k not in old)
    if len(removed) == 1 and len(added) == 1 and _same_type(old[removed[0]], new[added[0]]):
        findings.append(Finding("error", f"baseline-renamed-{noun}",
                                f"{noun} '{removed[0]}' was renamed to '{added[0]}'; "
                                f"{'requests' if noun == 'input' else 'clients'} use the old name: keep it"))
        removed, added = [], []
    for k in removed:
        findings.append(Finding("error", f"baseline-removed-{noun}",
                                f"{noun} '{k}' ({_dtype(old[k])} {_fmt(_shape(old[k]))}) was removed; "
                                f"{'requests send it' if noun == 'input' else 'clients read it'}"))
    for k in added:
        if noun == "input" and k in optional:
            findings.append(Finding("info", "baseline-added-optional-input",
                                    f"new input '{k}' ({_dtype(new[k])} {_fmt(_shape(new[k]))}) has a default in the "
                                    f"signature: requests without it still work (compatible)"))
        elif noun == "input":
            findings.append(Finding("error", "baseline-added-input",
                                    f"new input '{k}' ({_dtype(new[k])} {_fmt(_shape(new[k]))}): requests made for "
                                    f"the released model lack it, and the signature has no default for it"))
        else:
            findings.append(Finding("info", "baseline-added-output",
                                    f"new output '{k}' ({_dtype(new[k])} {_fmt(_shape(new[k]))}) (compatible)"))
    for k in sorted(k for k in old if k in new):
        od, nd = _dtype(old[k]), _dtype(new[k])
        if od != nd:
            findings.append(Finding("error", "baseline-dtype-changed", f"{noun} '{k}' dtype changed: {od} -> {nd}"))
        check = _input_shape if noun == "input" else _output_shape
        f = check(k, _shape(old[k]), _shape(new[k]))
        if f is not None:
            findings.append(f)
    return findings


def served_signature_findings(name: str, expected: dict, served: dict[str, dict]) -> list[Finding]:
    """The signature a server reports (GetModelMetadata) must be the SavedModel's: every difference is an error."""
    if name not in served:
        return [Finding("error", "serving-metadata",
                        f"signature '{name}' is not served (served: {', '.join(sorted(served)) or 'none'})")]
    return [Finding("error", "serving-metadata", f"the served signature '{name}' differs from the SavedModel's: "
                                                 f"{finding.message}")
            for finding in compare_signatures(expected, served[name])]


def compare_signatures(old: dict, new: dict) -> list[Finding]:
    """Findings for the changes from the released signature `old` to `new` (inputs first, then outputs)."""
    return (_compare_side("inputs", old.get("inputs") or {}, new.get("inputs") or {}, set(new.get("defaults") or ()))
            + _compare_side("outputs", old.get("outputs") or {}, new.get("outputs") or {}))


def compare_signature_sets(old: dict[str, dict], new: dict[str, dict]) -> list[Finding]:
    """Findings for every released signature against the new SavedModel's signatures of the same name."""
    findings: list[Finding] = []
    several = len(old) > 1 or len(new) > 1
    for name in old:
        if name not in new:
            findings.append(Finding("error", "baseline-removed-signature",
                                    f"signature '{name}' was removed; clients call it by name"))
            continue
        if (old[name].get("method") or new[name].get("method")) and old[name].get("method") != new[name].get("method"):
            findings.append(Finding("error", "baseline-method-changed",
                                    f"signature '{name}' method changed: {old[name].get('method')} -> "
                                    f"{new[name].get('method')}; clients call the API of the old one"))
        for finding in compare_signatures(old[name], new[name]):
            if several:
                finding = Finding(finding.severity, finding.code, f"signature '{name}': {finding.message}")
            findings.append(finding)
    for name in new:
        if name not in old:
            findings.append(Finding("info", "baseline-added-signature", f"new signature '{name}' (compatible)"))
    return findings
