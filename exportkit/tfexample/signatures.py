"""Signatures over serialized tf.Example: find them in the graph, read their feature spec, write valid Examples.

Estimators and TFX export `classify`, `regress` and `predict` signatures whose one input is a batch of serialized
`tf.Example` protos that the graph parses with ParseExample, ParseExampleV2 or ParseSingleExample. Random bytes
are not Examples: every runtime rejects them. So the spec the graph declares (dense keys with types, shapes and
defaults; sparse and ragged keys) is read here from the parse op's attributes and constant inputs, following the
input through the graph and its function library, and Examples are generated from it, with categorical strings
taken from the vocabulary tables the graph initialises where they can be found.

Reads the MetaGraphDef proto only; never imports TensorFlow.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from exportkit.savedmodel.graph import CALL_OPS, graph_of
from exportkit.savedmodel.protos import protos
from exportkit.savedmodel.reader import dtype_name, shape_list
from exportkit.tfexample.features import ExampleFeature

PARSE_OPS = frozenset({"ParseExample", "ParseExampleV2", "ParseSingleExample"})
_PASS_THROUGH = ("Identity", "IdentityN", "Reshape", "Squeeze", "ExpandDims", "StopGradient")
_TABLE_IMPORT_OPS = ("LookupTableImportV2", "LookupTableImport", "InitializeTableV2", "InitializeTable")
_TABLE_FILE_OPS = ("InitializeTableFromTextFileV2", "InitializeTableFromTextFile")
_LOOKUP_OPS = ("LookupTableFindV2", "LookupTableFind")
_MAX_VOCAB = 1000


@dataclass
class ExampleSpec:
    """What one signature input (serialized tf.Example) must contain."""

    input_key: str
    parse_op: str
    features: list[ExampleFeature]

    def describe(self) -> str:
        return ", ".join(f"{f.feature}:{f.kind}:{f.storage}" + (f"{f.shape}" if f.kind == "dense" else "")
                         for f in self.features)

    # The batch generator and the --inputs reader (exportkit.inputs.generate and .load, a lower layer) call these two.
    def generate(self, shape: tuple[int, ...], rng: np.random.Generator,
                 int_range: tuple[int, int] = (0, 10)) -> np.ndarray:
        return generate_examples(self, shape, rng, int_range)

    def check(self, values: np.ndarray) -> str | None:
        return check_examples(self, values)


# ------------------------------------------------------------------------------------------ graph scopes
class _Scope:
    """The top-level graph or one library function: nodes by name and who consumes what."""

    def __init__(self, name: str | None, nodes, args: list[str]):
        self.name = name
        self.nodes = {n.name: n for n in nodes}
        self.args = args
        self.callers: list[tuple[_Scope, object]] = []
        self.all: dict = {}
        self.consumers: dict[str, list[tuple[object, int, str]]] = {}
        for node in nodes:
            for index, ref in enumerate(node.input):
                if ref.startswith("^"):
                    continue
                self.consumers.setdefault(_producer(ref), []).append((node, index, ref))


def _producer(ref: str) -> str:
    return ref.split(":", 1)[0]


def _scopes(meta_graph) -> dict[str | None, _Scope]:
    """The top-level graph and each library function as a scope, from the one graph walker's indexes."""
    graph = graph_of(meta_graph)
    scopes = {None: _Scope(None, graph.top, [])}
    for name, fdef in graph.functions.items():
        scopes[name] = _Scope(name, fdef.node_def, graph.args(name))
    for name, scope in scopes.items():
        scope.all = scopes
        if name is not None:  # called through a call op: its data inputs are the arguments
            scope.callers = [(scopes[where], node) for where, node in graph.callers(name) if node.op in CALL_OPS]
    return scopes


def _origin(scope: _Scope, ref: str, depth: int = 0) -> tuple[_Scope, str]:
    """Where a function argument comes from: the caller's input, up to a non-argument (first caller wins)."""
    name = _producer(ref)
    if depth > 12 or name not in scope.args or not scope.callers:
        return scope, ref
    caller_scope, node = scope.callers[0]
    inputs = _data_inputs(node)
    index = scope.args.index(name)
    return _origin(caller_scope, inputs[index], depth + 1) if index < len(inputs) else (scope, ref)


def _find_parse_nodes(scopes, scope: _Scope, start: str, depth: int = 0, seen=None) -> list[tuple[_Scope, object]]:
    """Parse nodes whose `serialized` input is the tensor `start` (a node or argument name) of `scope`."""
    seen = set() if seen is None else seen
    if depth > 12 or (scope.name, start) in seen:
        return []
    seen.add((scope.name, start))
    found = []
    for node, index, _ in scope.consumers.get(start, []):
        if node.op in PARSE_OPS and index == 0:
            found.append((scope, node))
        elif node.op in _PASS_THROUGH and index == 0:
            found += _find_parse_nodes(scopes, scope, node.name, depth + 1, seen)
        elif node.op in CALL_OPS and "f" in node.attr:
            inner = scopes.get(node.attr["f"].func.name)
            if inner is not None and index < len(inner.args):
                found += _find_parse_nodes(scopes, inner, inner.args[index], depth + 1, seen)
    return found


# ------------------------------------------------------------------------------------------ constants
def _const(scope: _Scope, ref: str, depth: int = 0):
    """The TensorProto behind `ref` when it is a Const (through Identity, Reshape, function arguments), else None."""
    scope, ref = _origin(scope, ref)
    node = scope.nodes.get(_producer(ref))
    if node is None or depth > 8:
        return None
    if node.op == "Const":
        return node.attr["value"].tensor
    if node.op in ("Identity", "Reshape") and node.input:
        return _const(scope, node.input[0], depth + 1)
    return None


def _values(tensor) -> list:
    """The elements of a constant TensorProto as Python values (bytes for strings)."""
    if tensor is None:
        return []
    name = dtype_name(tensor.dtype)
    n = int(np.prod([d.size for d in tensor.tensor_shape.dim])) if tensor.tensor_shape.dim else 1
    if name == "string":
        values = list(tensor.string_val)
    elif tensor.tensor_content:
        values = np.frombuffer(tensor.tensor_content, dtype=np.dtype(name)).tolist()
    else:
        values = list(tensor.float_val if name == "float32" else tensor.int64_val if name == "int64"
                      else tensor.int_val if name.startswith(("int", "uint")) else tensor.double_val)
    if values and len(values) < n:  # a splat constant stores one value for all
        values = values + [values[-1]] * (n - len(values))
    return values[:n] if tensor.tensor_shape.dim else values


def _data_inputs(node) -> list[str]:
    return [ref for ref in node.input if not ref.startswith("^")]


# ------------------------------------------------------------------------------------------ parse ops
def _features_of(scope: _Scope, node) -> list[ExampleFeature]:
    attr = node.attr
    inputs = _data_inputs(node)
    tdense = [dtype_name(t) for t in attr["Tdense"].list.type] if "Tdense" in attr else []
    shapes = [shape_list(s) or [] for s in attr["dense_shapes"].list.shape] if "dense_shapes" in attr else []
    sparse_types = [dtype_name(t) for t in attr["sparse_types"].list.type] if "sparse_types" in attr else []
    ragged_types = [dtype_name(t) for t in attr["ragged_value_types"].list.type] if "ragged_value_types" in attr else []
    if node.op == "ParseExampleV2":
        sparse_keys = [k for k in _values(_const(scope, inputs[2]))]
        dense_keys = [k for k in _values(_const(scope, inputs[3]))]
        ragged_keys = [k for k in _values(_const(scope, inputs[4]))]
        defaults = [_const(scope, ref) for ref in inputs[5:5 + len(tdense)]]
    elif node.op == "ParseExample":
        n_sparse, n_dense = int(attr["Nsparse"].i), int(attr["Ndense"].i)
        sparse_keys = [(_values(_const(scope, ref)) or [b"?"])[0] for ref in inputs[2:2 + n_sparse]]
        dense_keys = [(_values(_const(scope, ref)) or [b"?"])[0] for ref in inputs[2 + n_sparse:2 + n_sparse + n_dense]]
        ragged_keys = []
        defaults = [_const(scope, ref) for ref in inputs[2 + n_sparse + n_dense:]]
    else:  # ParseSingleExample: keys are attributes
        sparse_keys = list(attr["sparse_keys"].list.s)
        dense_keys = list(attr["dense_keys"].list.s)
        ragged_keys = []
        defaults = [_const(scope, ref) for ref in inputs[1:]]
    features = []
    for i, key in enumerate(dense_keys):
        default = defaults[i] if i < len(defaults) else None
        values = _values(default)
        features.append(ExampleFeature(_text(key), tdense[i] if i < len(tdense) else "float32",
                                       shapes[i] if i < len(shapes) else [], default=values or None))
    for i, key in enumerate(sparse_keys):
        features.append(ExampleFeature(_text(key), sparse_types[i] if i < len(sparse_types) else "float32",
                                       kind="sparse"))
    for i, key in enumerate(ragged_keys):
        features.append(ExampleFeature(_text(key), ragged_types[i] if i < len(ragged_types) else "float32",
                                       kind="ragged"))
    return features


def _text(key) -> str:
    return key.decode("utf-8", "replace") if isinstance(key, bytes) else str(key)


# ------------------------------------------------------------------------------------------ vocabularies
def _output_refs(scope: _Scope, node, features: list[ExampleFeature]) -> dict[str, list[str]]:
    """Feature key -> the producer references of its values output (graph: `node:k`, function: `node:name:i`)."""
    kinds = {k: [f for f in features if f.kind == k] for k in ("sparse", "dense", "ragged")}
    n_sparse = len(kinds["sparse"])
    refs: dict[str, list[str]] = {}
    for i, f in enumerate(kinds["sparse"]):
        refs[f.feature] = [f"{node.name}:{n_sparse + i}", f"{node.name}:sparse_values:{i}"]
    for i, f in enumerate(kinds["dense"]):
        refs[f.feature] = [f"{node.name}:{3 * n_sparse + i}", f"{node.name}:dense_values:{i}"]
    base = 3 * n_sparse + len(kinds["dense"])
    for i, f in enumerate(kinds["ragged"]):
        refs[f.feature] = [f"{node.name}:{base + i}", f"{node.name}:ragged_values:{i}"]
    for f in features:  # ParseSingleExample / single outputs written without an index
        if len(features) == 1:
            refs[f.feature].append(node.name)
    return refs


def _lookup_tables(scope: _Scope, refs: list[str], limit: int = 10) -> list[tuple[str | None, str]]:
    """(scope, node name) of the table nodes that look up the values behind `refs`, within a few ops downstream."""
    frontier, seen, tables = list(refs), set(), []
    for _ in range(limit):
        nxt = []
        for ref in frontier:
            if ref in seen:
                continue
            seen.add(ref)
            for node, index, exact in scope.consumers.get(_producer(ref), []):
                if exact != ref and not (ref == _producer(ref) and exact.startswith(ref)):
                    continue
                if node.op in _LOOKUP_OPS and index == 1:
                    table_scope, table = _origin(scope, _data_inputs(node)[0])
                    tables.append((table_scope.name, _producer(table)))
                else:
                    nxt.append(node.name)
        frontier = nxt
        if not frontier:
            break
    return tables


def _vocabularies(meta_graph, scopes, version_dir: Path | None) -> dict[tuple[str | None, str], list[bytes]]:
    """(scope name, table node name) -> its string keys, from constant imports or vocabulary asset files."""
    assets = {}
    for asset in meta_graph.asset_file_def:
        assets[_producer(asset.tensor_info.name)] = asset.filename
    found = {}
    for scope in scopes.values():
        for node in scope.nodes.values():
            inputs = _data_inputs(node)
            if node.op not in _TABLE_IMPORT_OPS + _TABLE_FILE_OPS or len(inputs) < 2:
                continue
            table_scope, table = _origin(scope, inputs[0])
            if node.op in _TABLE_IMPORT_OPS:
                keys = _const(scope, inputs[1])
                if keys is not None and dtype_name(keys.dtype) == "string":
                    found[(table_scope.name, _producer(table))] = _values(keys)[:_MAX_VOCAB]
            elif node.attr["key_index"].i == -2:
                file_scope, file_ref = _origin(scope, inputs[1])
                words = _asset_lines(assets.get(_producer(file_ref)) if file_scope.name is None else None,
                                     _values(_const(scope, inputs[1])), version_dir)
                if words:
                    found[(table_scope.name, _producer(table))] = words
    return found


def _asset_lines(asset_name: str | None, const_values: list, version_dir: Path | None) -> list[bytes] | None:
    if version_dir is None:
        return None
    candidates = [version_dir / "assets" / asset_name] if asset_name else []
    candidates += [version_dir / "assets" / Path(_text(v)).name for v in const_values]
    for path in candidates:
        if path.is_file():
            lines = [line.rstrip(b"\r") for line in path.read_bytes().split(b"\n")[:_MAX_VOCAB] if line.strip()]
            return lines or None
    return None


# ------------------------------------------------------------------------------------------ public
def example_inputs(meta_graph, signature_name: str, version_dir: str | Path | None = None) -> dict[str, ExampleSpec]:
    """{input key: ExampleSpec} for the signature's inputs that are serialized tf.Examples (often empty)."""
    if signature_name not in meta_graph.signature_def:
        return {}
    signature = meta_graph.signature_def[signature_name]
    string_inputs = {k: v for k, v in signature.inputs.items()
                     if dtype_name(v.dtype) == "string" and v.WhichOneof("encoding") == "name"}
    if not string_inputs:
        return {}
    scopes = _scopes(meta_graph)
    top = scopes[None]
    vocabularies = None
    result = {}
    for key, info in sorted(string_inputs.items()):
        parse_nodes = _find_parse_nodes(scopes, top, _producer(info.name))
        if not parse_nodes:
            continue
        features: dict[str, ExampleFeature] = {}
        for scope, node in parse_nodes:
            specs = _features_of(scope, node)
            if any(f.storage == "string" for f in specs):
                if vocabularies is None:
                    vocabularies = _vocabularies(meta_graph, scopes, Path(version_dir) if version_dir else None)
                refs = _output_refs(scope, node, specs)
                for f in specs:
                    for table in _lookup_tables(scope, refs[f.feature]) if f.storage == "string" else []:
                        f.vocabulary = vocabularies.get(table) or f.vocabulary
                strings = [f for f in specs if f.storage == "string"]
                distinct = {tuple(v) for v in vocabularies.values()}
                if len(strings) == 1 and strings[0].vocabulary is None and len(distinct) == 1:
                    strings[0].vocabulary = list(distinct.pop())  # the model's only string feature and vocabulary
            for f in specs:
                features.setdefault(f.feature, f)
        result[key] = ExampleSpec(input_key=key, parse_op=parse_nodes[0][1].op, features=list(features.values()))
    return result


def input_specs(meta_graph, signature_name: str, signature: dict, version_dir: str | Path | None = None) -> list:
    """The signature's inputs as batches.InputSpec, with the ExampleSpec of those that are serialized tf.Example
    (so generated inputs are Examples the model parses). `signature`: savedmodel.signatures_of's form."""
    from exportkit.inputs.spec import InputSpec
    from exportkit.savedmodel.signature_defs import graph_shape

    examples = example_inputs(meta_graph, signature_name, version_dir)

    def shape(v: dict) -> list[int]:  # a TensorInfo without a shape: the graph's, else a batch of scalars
        known = v["shape"] if v["shape"] is not None else graph_shape(meta_graph, v.get("name"))
        return known if known is not None else [-1]

    return [InputSpec(key=k, dtype=v["dtype"], shape=shape(v), examples=examples.get(k))
            for k, v in signature["inputs"].items()]


def _example_proto():
    return protos()["example"].Example


def make_example(spec: ExampleSpec, rng: np.random.Generator, int_range: tuple[int, int] = (0, 10)) -> bytes:
    """One serialized tf.Example with every feature of `spec`, values drawn from the declared types."""
    example = _example_proto()()
    for f in spec.features:
        if f.kind == "dense":
            n = 1
            for d in f.shape:
                n *= d if d >= 0 else 2  # variable-length dense (allow_missing): two values
        else:
            n = int(rng.integers(1, 4))
        feature = example.features.feature[f.feature]
        if f.storage == "string":
            if f.vocabulary:
                values = [f.vocabulary[int(i)] for i in rng.integers(0, len(f.vocabulary), size=n)]
            else:
                letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz", dtype=np.uint8)
                values = [bytes(rng.choice(letters, size=int(rng.integers(1, 9))).tolist()) for _ in range(n)]
            feature.bytes_list.value.extend(values)
        elif f.storage in ("float32", "float64", "float16", "bfloat16"):
            feature.float_list.value.extend(rng.standard_normal(n).astype(np.float32).tolist())
        else:
            feature.int64_list.value.extend(rng.integers(int_range[0], int_range[1], size=n).tolist())
    return example.SerializeToString(deterministic=True)


def generate_examples(spec: ExampleSpec, shape: tuple[int, ...], rng: np.random.Generator,
                      int_range: tuple[int, int] = (0, 10)) -> np.ndarray:
    """An object array of serialized Examples of `shape`."""
    out = np.empty(shape, dtype=object)
    for idx in np.ndindex(*shape):
        out[idx] = make_example(spec, rng, int_range)
    return out


def check_examples(spec: ExampleSpec, values: np.ndarray) -> str | None:
    """Why `values` are not Examples this signature can parse (first problem), or None when they look right."""
    example = _example_proto()()
    kinds = {"string": "bytes_list", "int64": "int64_list"}
    for i, raw in enumerate(np.asarray(values, dtype=object).reshape(-1)):
        try:
            example.ParseFromString(bytes(raw))
        except Exception:  # noqa: BLE001 — protobuf's DecodeError and friends
            return f"element {i} is not a serialized tf.Example"
        for f in spec.features:
            feature = example.features.feature.get(f.feature)
            if feature is None or feature.WhichOneof("kind") is None:
                if f.kind == "dense" and f.default is None:
                    return f"element {i} lacks the required feature {f.feature!r}"
                continue
            want = kinds.get(f.storage, "float_list")
            if feature.WhichOneof("kind") != want:
                return f"element {i}: feature {f.feature!r} is a {feature.WhichOneof('kind')}, the model parses {want}"
    return None


def parse_example(serialized: bytes):
    """A serialized tf.Example as the proto."""
    example = _example_proto()()
    example.ParseFromString(bytes(serialized))
    return example

