"""Build the op-library test models the way their users write them, in a process of their own (importing
tensorflow_text or loading a custom op registers ops for good: the test process must stay without them).

    python build_models.py OUT_DIR [CUSTOM_OP.so]   ->  OUT_DIR/<name>/1/ and OUT_DIR/built.json
built.json: {name: {"path": version dir} | {"skip": why}}.
"""
import json
import os
import sys
import traceback
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ["CUDA_VISIBLE_DEVICES"] = ""
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

OUT = Path(sys.argv[1])
OUT.mkdir(parents=True, exist_ok=True)
SO = sys.argv[2] if len(sys.argv) > 2 else None
built = {}


def model(name):
    def wrap(fn):
        target = OUT / name / "1"
        try:
            fn(target)
            built[name] = {"path": str(target)}
        except ImportError as err:
            built[name] = {"skip": f"{type(err).__name__}: {err}"}
        except Exception:  # noqa: BLE001  (a builder that breaks is a test failure, reported by the test)
            built[name] = {"error": traceback.format_exc()[-2000:]}
        return fn
    return wrap


@model("whitespace")
def whitespace(target):
    """tf.Module + tf.saved_model.save with TF Text's WhitespaceTokenizer: tokens per row."""
    import tensorflow_text as text

    class Tokens(tf.Module):
        def __init__(self):
            super().__init__()
            self.tokenizer = text.WhitespaceTokenizer()

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="sentence")])
        def serve(self, sentence):
            tokens = self.tokenizer.tokenize(sentence)
            return {"count": tokens.row_lengths(), "first": tokens.to_tensor(default_value="")[:, :1]}

    module = Tokens()
    tf.saved_model.save(module, str(target), signatures={"serving_default": module.serve})


@model("bert")
def bert(target):
    """BERT-style preprocessing: BertTokenizer over a vocabulary file (an asset), padded ids."""
    import tensorflow_text as text

    vocab = OUT / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "the", "cat", "sat", "on", "mat", "##s"]) + "\n")

    class Preprocess(tf.Module):
        def __init__(self):
            super().__init__()
            self.tokenizer = text.BertTokenizer(str(vocab), lower_case=True, token_out_type=tf.int64)

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text")])
        def serve(self, sentences):
            ids = self.tokenizer.tokenize(sentences).merge_dims(-2, -1)
            return {"input_ids": ids.to_tensor(default_value=0, shape=[None, 8])}

    module = Preprocess()
    tf.saved_model.save(module, str(target), signatures={"serving_default": module.serve})


@model("round_robin")
def round_robin(target):
    """TF Text's RoundRobinTrimmer (keras-hub packs segments with it): TFText>RoundRobinTrim, newer than the
    tensorflow-text 2.12.1 that TF Serving 2.12-2.19 link."""
    import tensorflow_text as text

    class Trim(tf.Module):
        def __init__(self):
            super().__init__()
            self.trimmer = text.RoundRobinTrimmer(max_seq_length=4)

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="a"),
                                      tf.TensorSpec([None], tf.string, name="b")])
        def serve(self, a, b):
            ta = tf.strings.split(a)
            tb = tf.strings.split(b)
            x, y = self.trimmer.trim([ta, tb])
            return {"kept": x.row_lengths() + y.row_lengths()}

    module = Trim()
    tf.saved_model.save(module, str(target), signatures={"serving_default": module.serve})


@model("ydf_gbt")
def ydf_gbt(target):
    """A YDF gradient-boosted trees model exported with to_tensorflow_saved_model (SimpleML* ops)."""
    import ydf

    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 3)).astype(np.float32)
    data = {"a": x[:, 0], "b": x[:, 1], "c": x[:, 2], "label": (x[:, 0] + x[:, 1] > 0).astype(np.int64)}
    trained = ydf.GradientBoostedTreesLearner(label="label", num_trees=5, max_depth=3).train(data)
    trained.to_tensorflow_saved_model(str(target), mode="tf")


@model("custom_op")
def custom_op(target):
    """A tf.Module calling a user's op from a .so (tf.load_op_library), as teams with custom kernels do."""
    if SO is None:
        raise ImportError("no custom op library was built")
    lib = tf.load_op_library(SO)

    class Double(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32, name="x")])
        def serve(self, x):
            return {"y": lib.exportkit_times_two(x) + 1.0}

    module = Double()
    tf.saved_model.save(module, str(target), signatures={"serving_default": module.serve})


def _tf1(target, pin_serving: bool):
    """A TF1 graph (tf.compat.v1 + SavedModelBuilder) with part of it pinned to /device:GPU:0."""
    v1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        x = v1.placeholder(tf.float32, [None, 2], name="x")
        w = v1.get_variable("w", initializer=tf.constant([[1.0, 2.0], [3.0, 4.0]]))
        with tf.device("/device:GPU:0"):
            pinned = tf.matmul(x, w, name="pinned_matmul") if pin_serving else tf.identity(w, name="unused_copy")
        y = pinned if pin_serving else tf.matmul(x, w, name="matmul")
        with v1.Session(graph=graph, config=v1.ConfigProto(allow_soft_placement=True)) as sess:
            sess.run(v1.global_variables_initializer())
            builder = v1.saved_model.Builder(str(target))
            signature = v1.saved_model.predict_signature_def({"x": x}, {"y": y})
            builder.add_meta_graph_and_variables(sess, ["serve"], {"serving_default": signature},
                                                 clear_devices=False)
            builder.save()


@model("gpu_pinned_function")
def gpu_pinned_function(target):
    """tf.device('/GPU:0') inside a tf.function: the pin is soft there (a CPU server runs it)."""

    class Pinned(tf.Module):
        def __init__(self):
            super().__init__()
            self.w = tf.Variable([[1.0, 2.0], [3.0, 4.0]])

        @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32, name="x")])
        def serve(self, x):
            with tf.device("/device:GPU:0"):
                y = tf.matmul(x, self.w)
            return {"y": y + 1.0}

    module = Pinned()
    tf.saved_model.save(module, str(target), signatures={"serving_default": module.serve})


@model("gpu_pinned")
def gpu_pinned(target):
    _tf1(target, pin_serving=True)


@model("gpu_pinned_unused")
def gpu_pinned_unused(target):
    _tf1(target, pin_serving=False)


(OUT / "built.json").write_text(json.dumps(built, indent=1))
