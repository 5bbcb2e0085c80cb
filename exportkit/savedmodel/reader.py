"""Reading saved_model.pb without TensorFlow: the SavedModel proto, the MetaGraph TF Serving loads, dtype and
shape names. `import tensorflow` costs about 3 s; the generated protobuf modules need only `google.protobuf`
(exportkit.savedmodel.protos)."""
from __future__ import annotations

from pathlib import Path

from exportkit.dtypes import canonical
from exportkit.errors import UsageError
from exportkit.savedmodel.protos import protos
from exportkit.savedmodel.versions import SAVED_MODEL_PB, SAVED_MODEL_PBTXT, resolve_savedmodel_dir
from exportkit.signature_constants import SERVE_TAG


def read_saved_model_proto(path: str | Path):
    """Parse `<dir>/saved_model.pb` (or .pbtxt) into a `tensorflow.SavedModel` message, without importing TF.

    `path` may be a version directory or a model base directory, or their bucket URL (see `resolve_savedmodel_dir`;
    the variables' bytes are not downloaded for it).
    """
    directory = resolve_savedmodel_dir(path, variables=False)
    pb = protos()["saved_model"]
    proto = pb.SavedModel()
    binary, text = directory / SAVED_MODEL_PB, directory / SAVED_MODEL_PBTXT
    try:
        if binary.is_file():
            proto.ParseFromString(binary.read_bytes())
        else:
            from google.protobuf import text_format

            text_format.Parse(text.read_text(encoding="utf-8"), proto)
    except Exception as err:  # DecodeError, ParseError, OSError
        raise UsageError(f"cannot parse {binary if binary.is_file() else text}: {type(err).__name__}: {err}",
                         "the file is damaged or not a SavedModel; export the model again") from err
    if not proto.meta_graphs:
        raise UsageError(f"{directory} holds a SavedModel without any MetaGraph", "export the model again")
    return proto


# ---------------------------------------------------------------------------------------- MetaGraph choice
def select_meta_graph(saved_model, tags: list[str] | tuple[str, ...] | None = None):
    """The MetaGraph with exactly `tags` (default: the one TF Serving loads, tagged `serve`), else the first."""
    graphs = list(saved_model.meta_graphs)
    wanted = set(tags) if tags else {SERVE_TAG}
    for mg in graphs:
        if set(mg.meta_info_def.tags) == wanted:
            return mg
    if not tags:
        for mg in graphs:
            if SERVE_TAG in mg.meta_info_def.tags:
                return mg
        return graphs[0]
    available = ["{" + ",".join(mg.meta_info_def.tags) + "}" for mg in graphs]
    raise UsageError(f"no MetaGraph with tags {sorted(wanted)}; available: {', '.join(available)}",
                     "pick one of the available tag sets")


# ----------------------------------------------------------------------------------------- dtypes, shapes
def dtype_name(dtype_enum: int) -> str:
    """A DataType enum value by its canonical name (exportkit.dtypes): float32, bfloat16, int64, string, ..."""
    types_pb2 = protos()["types"]
    try:
        return canonical(types_pb2.DataType.Name(int(dtype_enum)))
    except ValueError:
        return f"dtype_{int(dtype_enum)}"


def shape_list(shape_proto) -> list[int] | None:
    """A TensorShapeProto as a list with -1 for unknown dimensions; None when the rank is unknown."""
    if shape_proto is None or shape_proto.unknown_rank:
        return None
    return [int(d.size) if d.size >= 0 else -1 for d in shape_proto.dim]
