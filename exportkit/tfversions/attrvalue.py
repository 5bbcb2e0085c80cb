"""One JSON spelling of a TensorFlow AttrValue, shared by the registry builder and the static analysis.

Registries store OpDef defaults in this form and the analysis turns each NodeDef attr into it, so "is this
attr set to its default?" is a plain `==`. Pure Python, no imports: `tools/build_registries.py` loads this
file by path inside a throwaway TensorFlow environment.
"""


def _shape(shape):
    return None if shape.unknown_rank else [int(d.size) for d in shape.dim]


def _tensor(tensor):
    return {"tensor": tensor.SerializeToString(deterministic=True).hex()}


def _scalar(field, value):
    if field == "s":
        return value.decode("utf-8", "backslashreplace")
    if field == "shape":
        return _shape(value)
    if field == "tensor":
        return _tensor(value)
    if field == "func":
        return {"func": value.name}
    if field == "f":
        return float(value)
    if field in ("i", "type"):
        return int(value)
    return value  # b


_LIST_FIELDS = ("s", "i", "f", "b", "type", "shape", "tensor", "func")


def attr_json(value):
    """An AttrValue as JSON: scalars as themselves (types as DataType numbers), lists as lists, shapes as
    dim lists (None = unknown rank), funcs as {"func": name}, tensors as {"tensor": hex}; unset as None."""
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "list":
        items = []
        for field in _LIST_FIELDS:
            items.extend(_scalar(field, v) for v in getattr(value.list, field))
        return items
    if kind == "placeholder":
        return {"placeholder": value.placeholder}
    return _scalar(kind, getattr(value, kind))
