"""TF Serving's REST JSON, by direction: parse (the text, as rapidjson reads it), decode (JSON -> tensors),
fixed (the fixed-width float fast path, both ways), encode (tensors -> JSON answers), examples (tf.Example JSON)."""
