"""The verdict TF Serving would give, where verify's runtimes alone would give another one.

* TF Serving loads models with the TF1 loader: a model only `tf.saved_model.load` (the TF2 loader) fails on is
  served fine, so that failure is a warning about TF2 users, not a failed check (`tf2_only_failures`).
* A signature that updates variables (a counter: `assign_add`), or reads one that another signature updates, answers
  from state each loaded copy keeps for itself: two runs of one request differ by design, and runtimes that loaded
  the model separately cannot be compared (`signature_state`). TF Serving answers such signatures; the cause of the
  difference is state, not randomness.
* TF Serving's REST API cannot call a signature without inputs (`rest_refusal`); gRPC Predict can.

Results are verify's RuntimeResult rows, used by attribute (name, status, error, signature): this layer does not
import verify.
"""
from __future__ import annotations

from dataclasses import dataclass

from exportkit.findings import Finding
from exportkit.savedmodel.graph import graph_of, tensor_info_names, tensor_node

# Ops that write a variable (ref or resource) they take as input 0.
STATE_WRITES = frozenset({
    "Assign", "AssignAdd", "AssignSub", "AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp",
    "ScatterAdd", "ScatterSub", "ScatterMul", "ScatterDiv", "ScatterMin", "ScatterMax", "ScatterUpdate",
    "ScatterNdAdd", "ScatterNdSub", "ScatterNdUpdate", "ResourceScatterAdd", "ResourceScatterSub",
    "ResourceScatterMul", "ResourceScatterDiv", "ResourceScatterMin", "ResourceScatterMax", "ResourceScatterUpdate",
    "ResourceScatterNdAdd", "ResourceScatterNdSub", "ResourceScatterNdUpdate", "ResourceApplyGradientDescent",
    "ApplyGradientDescent", "CountUpTo", "ResourceCountUpTo"})
VARIABLES = frozenset({"VariableV2", "Variable", "VarHandleOp"})


def _signature_roots(signature) -> list[str]:
    return [name for info in signature.outputs.values() for name in tensor_info_names(info)]


def _variables(meta_graph, roots: list[str]) -> tuple[set[str], set[str]]:
    """(variables written, variables read) by computing `roots`, by node name of the top-level graph's variable.
    Inside functions (TF2 writers) a write is counted by its op only: its variable is a captured handle."""
    by_name = {node.name: node for node in meta_graph.graph_def.node}
    writes, reads = set(), set()
    for function, node in graph_of(meta_graph).reachable_nodes(roots):
        if node.op in VARIABLES and function is None:
            reads.add(node.name)
        if node.op in STATE_WRITES and node.input:
            target = tensor_node(node.input[0])
            source = by_name.get(target) if function is None else None
            writes.add(target if source is not None and source.op in VARIABLES else
                       f"{target} (in function {function})" if function else target)
    return writes, reads


@dataclass(frozen=True)
class SignatureState:
    """Why a signature's answers depend on state: `writes` (it updates a variable: two runs of one request may
    differ) or not (it reads a variable another checked signature updates: runtimes that ran other calls before
    it hold other values). `finding` says so (code `stateful`)."""

    writes: bool
    finding: Finding


def signature_state(meta_graph, names) -> dict[str, SignatureState]:
    """The signatures among `names` (those verify calls, in turn, in every runtime) whose answers depend on state:
    those that update a variable, and those that read a variable another of them updates. (A variable only the
    warm-up updates is not state verify adds: the server answering from it must agree with a fresh load.)"""
    state = {name: _variables(meta_graph, _signature_roots(meta_graph.signature_def[name]))
             for name in names if name in meta_graph.signature_def}
    written = {v: name for name, (writes, _) in state.items() for v in writes}
    found = {}
    for name in names:
        writes, reads = state.get(name, (set(), set()))
        if writes:
            why = f"updates variable(s) {', '.join(sorted(writes))}: two runs of the same request differ"
        elif reads & set(written):
            variable = sorted(reads & set(written))[0]
            why = f"reads variable {variable}, which signature '{written[variable]}' updates"
        else:
            continue
        found[name] = SignatureState(bool(writes), Finding("warning", "stateful", (
            f"signature '{name}' {why}: its answers depend on the calls made before it (state, not randomness), "
            f"and every loaded copy of the model keeps its own state, so those outputs are left out of the "
            f"comparisons. TF Serving answers it from one state shared by all clients; check its values with your "
            f"own sequence of requests")))
    return found


def rest_refusal(signature: dict) -> str | None:
    """Why TF Serving's REST API cannot call this signature, or None. `signature`: savedmodel.signatures_of's form."""
    if not signature.get("inputs"):
        return ("TF Serving's REST API refuses a signature without inputs (its JSON request needs \"instances\" or "
                "\"inputs\"); gRPC Predict calls it")
    return None


TF2_LOADER = "saved_model"
TF1_LOADER = "session"


def tf2_only_failures(results) -> list[Finding]:
    """Rows of the TF2 loader that failed where the TF1 loader (TF Serving's) ran the same signature become
    `skipped`, with one warning: TF Serving serves the model, TF2 users cannot load it."""
    by_signature: dict = {}
    for row in results:
        by_signature.setdefault(row.signature, []).append(row)
    failed = []
    for rows in by_signature.values():
        served = any(r.name.split("@")[0] == TF1_LOADER and r.status == "ok" for r in rows)
        for row in rows:
            if served and row.name.split("@")[0] == TF2_LOADER and row.status == "error":
                failed.append(row)
    if not failed:
        return []
    reason = failed[0].error.splitlines()[0]
    for row in failed:
        row.status = "skipped"
        row.error = (f"{row.error.splitlines()[0]} (TF2 loader only: TF Serving's TF1 loader loads and runs it, so "
                     f"this is not a serving failure)")
    signatures = sorted({r.signature for r in failed if r.signature})
    return [Finding("warning", "tf2-load-failed", (
        f"{reason}; the TF1 loader, the one TF Serving uses, loads and runs "
        f"{'signature(s) ' + ', '.join(signatures) if signatures else 'the model'}, so TF Serving serves it, but "
        f"TF2 users (tf.saved_model.load, TF-Hub-style reuse) cannot load it. fix: only if TF2 users need it, "
        f"export with TF2 APIs (resource variables, tf.function signatures)"))]
