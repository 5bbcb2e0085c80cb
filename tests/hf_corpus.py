"""Hugging Face TF models (transformers 4.x, tf_keras) built from tiny configs with random weights, nothing
downloaded. Each builder is written as a Hugging Face user writes one for exportkit's --builder: the model from
its config, called once on its dummy inputs so that its weights exist. test_sources_hf.py copies this file onto
--python-path; run as a script it writes what `save_pretrained` writes, as a user's training script would:

    python tests/hf_corpus.py OUT_DIR

OUT_DIR/<family>/tf_model.h5 (+ config.json) and, recorded from the model as trained, tf_model.h5.reference.npz
(exportkit.record_reference); OUT_DIR/distilbert_sm/saved_model/1 and OUT_DIR/bert_sm/saved_model/1 from
`save_pretrained(d, saved_model=True)`.
"""
from __future__ import annotations

import sys

VOCAB = 100


def distilbert():
    from transformers import DistilBertConfig, TFDistilBertForSequenceClassification

    model = TFDistilBertForSequenceClassification(
        DistilBertConfig(vocab_size=VOCAB, dim=32, n_layers=1, n_heads=2, hidden_dim=37))
    model(model.dummy_inputs)
    return model


def bert():
    from transformers import BertConfig, TFBertForSequenceClassification

    model = TFBertForSequenceClassification(
        BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=37,
                   max_position_embeddings=64, num_labels=3))
    model(model.dummy_inputs)
    return model


def gpt2():
    """A causal language model: logits over the vocabulary at every position, and its key/value cache
    (`past_key_values`, one [2, batch, heads, length, head size] tensor per block)."""
    from transformers import GPT2Config, TFGPT2LMHeadModel

    model = TFGPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=2, n_positions=64))
    model(model.dummy_inputs)
    return model


FAMILIES = {"distilbert": distilbert, "bert": bert, "gpt2": gpt2}


def main(out: str) -> None:
    from pathlib import Path

    import exportkit

    for name, build in FAMILIES.items():
        model = build()
        model.save_pretrained(f"{out}/{name}")
        exportkit.record_reference(model, Path(out, name, "tf_model.h5.reference.npz"), samples=4)
    distilbert().save_pretrained(f"{out}/distilbert_sm", saved_model=True)
    bert().save_pretrained(f"{out}/bert_sm", saved_model=True)  # token_type_ids index a 2-row table


if __name__ == "__main__":
    main(sys.argv[1])
