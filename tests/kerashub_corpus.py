"""keras-hub models built from config with random weights (nothing downloaded), tiny, saved as .keras the way a
user saves them. Used by test_kerashub.py; run as a script it measures how many keras-hub backbone classes
export clean with no flags:

    .venv/bin/python tests/kerashub_corpus.py OUT_DIR [CLASS ...]

Every Backbone class is given tiny values for the constructor arguments it requires (by name, TINY below);
a class whose arguments are not all covered counts as "not built".
"""
from __future__ import annotations

import inspect
import sys
import time
from pathlib import Path

VOCAB = 50
# Tiny values for the constructor arguments keras-hub's text backbones require, by name.
TINY = {
    "vocabulary_size": VOCAB, "num_layers": 2, "num_heads": 2, "num_query_heads": 2, "num_key_value_heads": 1,
    "hidden_dim": 16, "intermediate_dim": 32, "head_dim": 8, "max_sequence_length": 16, "key_value_dim": 8,
    "embedding_dim": 16, "num_groups": 1, "num_inner_repetitions": 1, "mlp_dim": 32, "patch_size": 4,
    "image_shape": (16, 16, 3), "num_segments": 2, "num_experts": 2, "top_k": 1, "num_experts_per_tok": 1,
    "moe_intermediate_dim": 16, "shared_expert_intermediate_dim": 16, "num_encoder_layers": 2,
    "num_decoder_layers": 2,
}
# The corpus the tests export: (name, builder) with builders taking the keras_hub module.
TEXT = dict(vocabulary_size=VOCAB, num_layers=2, hidden_dim=16, intermediate_dim=32)


def bert(hub):
    return hub.models.BertBackbone(**TEXT, num_heads=2, max_sequence_length=16)


def gpt2(hub):
    return hub.models.GPT2Backbone(**TEXT, num_heads=2, max_sequence_length=16)


def gemma(hub):
    """A Gemma-style decoder: grouped-query attention, RMS norm, rotary embeddings, tied embeddings."""
    return hub.models.GemmaBackbone(**TEXT, num_query_heads=2, num_key_value_heads=1, head_dim=8)


def vit(hub):
    return hub.models.ViTBackbone(image_shape=(16, 16, 3), patch_size=4, num_layers=2, num_heads=2, hidden_dim=16,
                                  mlp_dim=32)


def bert_classifier(hub):
    """A task model with its preprocessor (tokenizer over a 19-word vocabulary, saved as an asset)."""
    words = "the quick brown fox jumps over lazy dog a b c d e f".split()
    vocabulary = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words
    preprocessor = hub.models.BertTextClassifierPreprocessor(hub.models.BertTokenizer(vocabulary=vocabulary),
                                                             sequence_length=8)
    backbone = hub.models.BertBackbone(**{**TEXT, "vocabulary_size": len(vocabulary)}, num_heads=2,
                                       max_sequence_length=8)
    return hub.models.BertTextClassifier(backbone, num_classes=3, preprocessor=preprocessor)


CORPUS = {"bert": bert, "gpt2": gpt2, "gemma": gemma, "vit": vit, "bert_classifier": bert_classifier}


def tiny_backbone(cls):
    """`cls` built with TINY values for every required argument, or None when one has no tiny value."""
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    required = [p.name for p in params if p.default is p.empty and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]
    if any(name not in TINY for name in required):
        return None
    kwargs = {name: TINY[name] for name in required}
    if any(p.name == "max_sequence_length" for p in params):  # small position tables
        kwargs["max_sequence_length"] = TINY["max_sequence_length"]
    return cls(**kwargs)


def measure(out: Path, names: list[str]) -> int:
    """Build, save and export (self-check included) each backbone class; print one line per class."""
    import keras_hub

    from exportkit.errors import ExportkitError
    from exportkit.export.pipeline import Progress, export_model
    from exportkit.options.export import export_options

    names = names or sorted(n for n in dir(keras_hub.models) if n.endswith("Backbone") and n != "Backbone")
    counts = {"clean": 0, "refused": 0, "not built": 0}
    for name in names:
        start = time.perf_counter()
        try:
            model = tiny_backbone(getattr(keras_hub.models, name))
        except Exception as err:  # a tiny config the class rejects
            model, why = None, f"{type(err).__name__}: {' '.join(str(err).split())[:120]}"
        else:
            why = "a required argument has no tiny value"
        if model is None:
            counts["not built"] += 1
            print(f"{name:<34} not built ({why})", flush=True)
            continue
        src = out / f"{name}.keras"
        model.save(src)
        try:
            export_model(export_options(str(src), str(out / name)), Progress(open("/dev/null", "w")))
            verdict, counts["clean"] = "clean", counts["clean"] + 1
        except ExportkitError as err:
            verdict, counts["refused"] = f"exit {err.exit_code}: {' '.join(err.message.split())[:200]}", \
                counts["refused"] + 1
        except Exception as err:  # exportkit's own failure: reported, the measurement goes on
            verdict, counts["refused"] = f"crash {type(err).__name__}: {str(err)[:200]}", counts["refused"] + 1
        print(f"{name:<34} {verdict}  ({time.perf_counter() - start:.1f} s)", flush=True)
    print(f"tried {sum(counts.values())} backbone classes: {counts['clean']} export clean, {counts['refused']} "
          f"refused, {counts['not built']} not built from a tiny config")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    folder = Path(sys.argv[1])
    folder.mkdir(parents=True, exist_ok=True)
    sys.exit(measure(folder, sys.argv[2:]))
