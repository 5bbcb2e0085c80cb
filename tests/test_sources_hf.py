"""Issue 50: Hugging Face TF models as their users hand them over. `save_pretrained(d)` writes tf_model.h5 (tf_keras
weights by layer under a name that says nothing); with the builder a Hugging Face user writes, the weights load by
content and the export computes what the model computed as trained (its reference, recorded in the training
script). `save_pretrained(d, saved_model=True)` SavedModels keep verifying, inspecting and passing compat.

Three families (DistilBERT and BERT classifiers, a GPT-2 language model) from tiny configs (tests/hf_corpus.py),
built and exported in subprocesses: transformers sets TF_USE_LEGACY_KERAS when imported, which must not leak
into this process.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytestmark = [pytest.mark.slow]

HERE = Path(__file__).resolve().parent
FAMILIES = {"distilbert": {"input_ids", "attention_mask"},
            "bert": {"input_ids", "attention_mask", "token_type_ids"},
            "gpt2": {"input_ids", "attention_mask"}}
# GPT-2's key/value cache (past_key_values_0) holds the batch in its second dimension: TF Serving's REST row format
# and batching cannot serve it, so its users export the logits
FLAGS = {"gpt2": ["--signature", "serving_default:outputs=logits"]}


def _run(*args, cwd=None, timeout=600) -> subprocess.CompletedProcess:
    """A subprocess as a user runs it: TF_USE_LEGACY_KERAS not set."""
    env = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
    return subprocess.run([sys.executable, *map(str, args)], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("hf")
    (root / "site").mkdir()
    shutil.copy(HERE / "hf_corpus.py", root / "site" / "hf_builder.py")
    proc = _run(root / "site" / "hf_builder.py", root / "models", cwd=root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root


@pytest.fixture(scope="module")
def exports(corpus) -> dict:
    """One export per family: `exportkit export d/tf_model.h5 --builder hf_builder:FAMILY --python-path site`."""
    return {family: _run("-m", "exportkit", "export", corpus / "models" / family / "tf_model.h5", "--builder",
                         f"hf_builder:{family}", "--python-path", corpus / "site", "-o", corpus / "out" / family,
                         *FLAGS.get(family, []), cwd=corpus)
            for family in FAMILIES}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_tf_model_h5_with_builder_exports_what_was_trained(exports, corpus, family):
    proc = exports[family]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "(version 1, from weights," in proc.stdout  # loaded as the weights it is
    assert "trained -> reloaded passed" in proc.stdout, proc.stdout  # the loaded weights are the trained ones
    manifest = json.loads((corpus / "out" / family / "1" / "assets.extra" / "exportkit" / "manifest.json").read_text())
    (signature,) = manifest["signatures"].values()
    assert {k: v["dtype"] for k, v in signature["inputs"].items()} == {k: "int32" for k in FAMILIES[family]}
    # ranges the model accepts: the vocabulary for token ids, {0, 1} for the attention mask (and BERT's 2 segments)
    ranges = manifest["golden"]["int_ranges"]
    assert ranges["input_ids"] == "0:100" and ranges["attention_mask"] == "0:2", ranges
    assert ranges.get("token_type_ids", "0:2") == "0:2"


def test_exported_hf_model_verifies(exports, corpus):
    assert exports["distilbert"].returncode == 0
    proc = _run("-m", "exportkit", "verify", corpus / "out" / "distilbert", cwd=corpus)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PASSED" in proc.stdout


def test_save_pretrained_saved_model_verifies_inspects_and_passes_compat(corpus):
    pretrained = corpus / "models" / "distilbert_sm"
    proc = _run("-m", "exportkit", "export", pretrained, "-o", corpus / "out" / "dir", cwd=corpus)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"is a Hugging Face save_pretrained directory: its weights are {pretrained / 'tf_model.h5'}; its " \
           f"SavedModel, {pretrained / 'saved_model'}, verifies as it is" in proc.stderr, proc.stderr
    assert f"fix: pass {pretrained / 'tf_model.h5'} with --builder module:function" in proc.stderr
    version = pretrained / "saved_model" / "1"
    proc = _run("-m", "exportkit", "verify", version, cwd=corpus)
    assert proc.returncode == 0 and "PASSED" in proc.stdout, proc.stdout + proc.stderr
    proc = _run("-m", "exportkit", "inspect", version, "--json", cwd=corpus)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    inputs = json.loads(proc.stdout)["signatures"]["serving_default"]["inputs"]
    assert {k: v["dtype"] for k, v in inputs.items()} == {"input_ids": "int32", "attention_mask": "int32"}
    proc = _run("-m", "exportkit", "compat", version, "--tf", "2.12-2.21", cwd=corpus)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_save_pretrained_bert_saved_model_verifies_on_the_ranges_its_graph_bounds(corpus):
    """No manifest records its ranges: they are read from the graph (the default 0:10 overflows the 2 segments of
    token_type_ids, which no server request holds)."""
    from exportkit.savedmodel.int_ranges import graph_int_ranges
    from exportkit.savedmodel.reader import read_saved_model_proto, select_meta_graph
    from exportkit.savedmodel.signature_defs import signatures_of

    version = corpus / "models" / "bert_sm" / "saved_model" / "1"
    meta_graph = select_meta_graph(read_saved_model_proto(version))
    assert graph_int_ranges(meta_graph, signatures_of(meta_graph)) == {
        "input_ids": (0, 100), "token_type_ids": (0, 2), "attention_mask": (0, 2)}
    proc = _run("-m", "exportkit", "verify", version, "--runtimes", "saved_model,session", cwd=corpus)
    assert proc.returncode == 0 and "PASSED" in proc.stdout, proc.stdout + proc.stderr
    proc = _run("-m", "exportkit", "verify", version, "--runtimes", "saved_model", "--int-range", "0:10", cwd=corpus)
    assert proc.returncode == 1 and "is not in [0, 2)" in proc.stdout, proc.stdout  # --int-range still overrides


def test_a_tuple_inside_a_dict_output_is_one_output_per_tensor():
    import tensorflow as tf

    from exportkit.sources.model_io import flat_outputs, output_keys

    raw = {"logits": tf.zeros([2, 5]), "past_key_values": (tf.ones([2, 2, 3]), 2 * tf.ones([2, 2, 3]))}
    keys = output_keys(None, raw)
    assert keys == ["logits", "past_key_values_0", "past_key_values_1"]
    assert [float(t[0, 0, 0]) if t.shape.rank == 3 else t.shape[1] for t in flat_outputs(raw, keys)] == [5, 1.0, 2.0]
