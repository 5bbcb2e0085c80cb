"""Builders for the sample models: `module:function` + literal kwargs, each returning a *built* model.

Builders never touch the global dtype policy: the caller builds under whatever policy it wants
(`exportkit.tfenv.dtype_policy`, or the `policy` key of exportkit.toml). Layer names are fixed so that the
structure (and therefore the positional checkpoint keys) is the same on every call.
"""
from __future__ import annotations

import keras

from sample_models.custom_layers import FeatureCross, ResidualMLP, ScaledDense

DEFAULT_VOCABULARY = ("the", "cat", "dog", "sat", "on", "mat", "ran", "home", "a", "red")


def build_ranker(num_features: int = 8, hidden: int = 16) -> keras.Model:
    """Pointwise ranker: features -> Dense -> ScaledDense -> score (float32 head)."""
    features = keras.Input(shape=(num_features,), dtype="float32", name="features")
    x = keras.layers.Dense(hidden, activation="relu", name="dense_in")(features)
    x = ScaledDense(hidden, scale=0.5, activation="relu", name="scaled")(x)
    x = keras.layers.LayerNormalization(name="norm")(x)
    score = keras.layers.Dense(1, dtype="float32", name="score")(x)
    return keras.Model(inputs=features, outputs=score, name="ranker")


def build_other_ranker(num_features: int = 8, hidden: int = 16) -> keras.Model:
    """A ranker of a different architecture (no ScaledDense): its checkpoint must not restore into build_ranker."""
    features = keras.Input(shape=(num_features,), dtype="float32", name="features")
    x = keras.layers.Dense(hidden, activation="relu", name="dense_in")(features)
    score = keras.layers.Dense(1, dtype="float32", name="score")(x)
    return keras.Model(inputs=features, outputs=score, name="other_ranker")


def build_mixed_functional(num_features: int = 8, num_ids: int = 4, vocab_size: int = 50,
                           embed_dim: int = 8, hidden: int = 16) -> keras.Model:
    """Two inputs (float features, int ids), both custom layers, two outputs.

    `score` has an explicit float32 dtype; `embedding` keeps the policy's compute dtype (float16 under
    mixed_float16), so exporters have to cast it.
    """
    features = keras.Input(shape=(num_features,), dtype="float32", name="features")
    ids = keras.Input(shape=(num_ids,), dtype="int32", name="ids")
    e = keras.layers.Embedding(vocab_size, embed_dim, name="id_embedding")(ids)
    e = keras.layers.GlobalAveragePooling1D(name="id_pool")(e)
    f = keras.layers.BatchNormalization(name="feature_norm")(features)
    x = keras.layers.Concatenate(name="concat")([f, e])
    x = FeatureCross(name="cross")(x)
    x = ScaledDense(hidden, scale=0.5, activation="relu", name="scaled")(x)
    x = keras.layers.Dropout(0.1, name="dropout")(x)
    embedding = keras.layers.Dense(embed_dim, activation="tanh", name="embedding")(x)
    score = keras.layers.Dense(1, dtype="float32", name="score")(x)
    return keras.Model(inputs=[features, ids], outputs=[score, embedding], name="mixed_functional")


def build_multi_io(user_dim: int = 6, item_dim: int = 6, context_dim: int = 3, hidden: int = 16) -> keras.Model:
    """Three float inputs, dict outputs {"click": sigmoid prob, "dwell": non-negative regression}."""
    user = keras.Input(shape=(user_dim,), dtype="float32", name="user")
    item = keras.Input(shape=(item_dim,), dtype="float32", name="item")
    context = keras.Input(shape=(context_dim,), dtype="float32", name="context")
    u = keras.layers.Dense(hidden, activation="relu", name="user_tower")(user)
    i = keras.layers.Dense(hidden, activation="relu", name="item_tower")(item)
    dot = keras.layers.Dot(axes=1, normalize=True, name="cosine")([u, i])
    x = keras.layers.Concatenate(name="concat")([u, i, context, dot])
    x = keras.layers.Dense(hidden, activation="relu", name="joint")(x)
    click = keras.layers.Dense(1, activation="sigmoid", name="click")(x)
    dwell = keras.layers.Dense(1, activation="softplus", name="dwell")(x)
    return keras.Model(inputs={"user": user, "item": item, "context": context},
                       outputs={"click": click, "dwell": dwell}, name="multi_io")


def build_text_classifier(vocabulary=DEFAULT_VOCABULARY, embed_dim: int = 8, num_classes: int = 3) -> keras.Model:
    """String tokens (None, 1) -> StringLookup (fixed vocabulary) -> Embedding -> pooling -> logits."""
    text = keras.Input(shape=(1,), dtype="string", name="text")
    ids = keras.layers.StringLookup(vocabulary=list(vocabulary), num_oov_indices=1, name="lookup")(text)
    e = keras.layers.Embedding(len(vocabulary) + 1, embed_dim, name="token_embedding")(ids)
    x = keras.layers.GlobalAveragePooling1D(name="pool")(e)
    x = keras.layers.Dense(embed_dim, activation="relu", name="hidden")(x)
    logits = keras.layers.Dense(num_classes, dtype="float32", name="logits")(x)
    return keras.Model(inputs=text, outputs=logits, name="text_classifier")


def build_subclassed(input_dim: int = 8, hidden: int = 16, blocks: int = 2) -> keras.Model:
    """The registered subclassed ResidualMLP, built by calling it on a concrete batch (saves a build config)."""
    import numpy as np

    model = ResidualMLP(hidden=hidden, blocks=blocks, name="residual_mlp")
    model(np.zeros((1, input_dim), dtype="float32"))
    return model


def build_tfk2_functional(num_features: int = 8, num_ids: int = 4, vocab_size: int = 50,
                          embed_dim: int = 8, hidden: int = 16):
    """The same kind of two-input ranker, written with tf.keras 2 (`tf_keras`); only built-in layers.

    Includes a nested functional model (feature_tower) and a nested Sequential (block): legacy configs then
    nest layer configs and dtype policies, and number nested models' nodes the tf.keras 2 way.
    """
    import tf_keras

    features = tf_keras.Input(shape=(num_features,), dtype="float32", name="features")
    ids = tf_keras.Input(shape=(num_ids,), dtype="int32", name="ids")
    e = tf_keras.layers.Embedding(vocab_size, embed_dim, name="id_embedding")(ids)
    e = tf_keras.layers.GlobalAveragePooling1D(name="id_pool")(e)
    tower_in = tf_keras.Input(shape=(num_features,), name="tower_in")
    t = tf_keras.layers.BatchNormalization(name="feature_norm")(tower_in)
    t = tf_keras.layers.Dense(hidden, activation="relu", name="tower_dense")(t)
    tower = tf_keras.Model(tower_in, t, name="feature_tower")
    f = tower(features)
    x = tf_keras.layers.Concatenate(name="concat")([f, e])
    block = tf_keras.Sequential([
        tf_keras.layers.Dense(hidden, activation="relu", name="block_dense"),
        tf_keras.layers.Dropout(0.1, name="block_dropout"),
        tf_keras.layers.Dense(hidden, activation="relu", name="block_out"),
    ], name="block")
    x = block(x)
    x = tf_keras.layers.LayerNormalization(name="norm")(x)
    embedding = tf_keras.layers.Dense(embed_dim, activation="tanh", name="embedding")(x)
    score = tf_keras.layers.Dense(1, name="score_logit")(x)
    score = tf_keras.layers.Activation("linear", dtype="float32", name="score")(score)
    return tf_keras.Model(inputs=[features, ids], outputs=[score, embedding], name="tfk2_ranker")
