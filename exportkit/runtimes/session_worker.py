"""The serving-equivalent runtime's process: TF1 loader + Session.run, with no user code importable.

Started as `python -I -m exportkit.runtimes.session_worker` from a neutral working directory, so neither the
caller's cwd nor PYTHONPATH is on sys.path. It imports TensorFlow at once (so the import overlaps with the
caller's work) and then answers one JSON request per line on stdin:

    {"op": "load", "path": DIR, "signature": NAME}        -> {"ok": true}
    {"op": "run", "dir": DIR, "inputs": PREFIX, "outputs": PREFIX, "signature": NAME} -> {"ok": true}
                                                          (batch files: exportkit.batches; signature: the loaded one
                                                          unless given)
    failures                                              -> {"ok": false, "kind": "model"|"infra", "message": ...}
"""
from __future__ import annotations

import json
import os
import sys
import traceback


def _reply(stream, **payload) -> None:
    stream.write(json.dumps(payload) + "\n")
    stream.flush()


def main() -> int:
    # Keep our protocol channel clean: anything TF prints goes to stderr.
    channel = sys.stdout
    sys.stdout = sys.stderr
    from exportkit.tfenv import import_tf

    tf = import_tf()
    from exportkit.savedmodel import signature_names
    from exportkit.tf1_loader import Tf1SavedModel
    from exportkit.batches import load_batches, save_batches

    _reply(channel, ok=True, ready=True, tf=tf.__version__)
    model = signature = None
    for line in sys.stdin:
        request = json.loads(line)
        try:
            if request["op"] == "load":
                signature = request["signature"]
                # TensorFloat-32 would make GPU float32 results differ from CPU by ~1e-3: off unless allowed.
                tf.config.experimental.enable_tensor_float_32_execution(bool(request.get("allow_tf32")))
                model = Tf1SavedModel(request["path"], device=request.get("device"))
                if signature not in model.signatures:
                    _reply(channel, ok=False, kind="model",
                           message=f"no signature {signature!r} (available: "
                                   f"{', '.join(signature_names(model.signatures)) or 'none'})")
                    continue
                _reply(channel, ok=True)
            elif request["op"] == "run":
                name = request.get("signature") or signature
                if name not in model.signatures:
                    _reply(channel, ok=False, kind="model",
                           message=f"no signature {name!r} (available: {', '.join(sorted(model.signatures))})")
                    continue
                batches = load_batches(request["dir"], request["inputs"])
                outputs = [model.run(name, batch) for batch in batches]
                save_batches(request["dir"], outputs, request["outputs"])
                _reply(channel, ok=True)
        except Exception as err:  # the model's failure: report it, stay alive for the caller to close
            message = f"{type(err).__name__}: {' '.join(str(err).split())[:500]}"
            _reply(channel, ok=False, kind="model", message=message, detail=traceback.format_exc()[-4000:])
    return 0


if __name__ == "__main__":
    code = main()
    sys.stderr.flush()
    os._exit(code)  # stdin closed: the caller is done; TensorFlow's teardown would only make it wait
