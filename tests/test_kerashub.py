"""Issue 23: what keras-hub builds, and plain Keras models with several integer vocabularies, export and verify
with no flags: integer ranges come from what each input indexes in the traced graph, and the custom-object
contract check replays layers with the arguments they were really called with.

keras-hub models are built at test time from tiny configs (tests/kerashub_corpus.py, random weights, nothing
downloaded); those tests skip without keras-hub (in the dev extra).
"""
from __future__ import annotations

import json
import textwrap

import pytest

from conftest import invoke

pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")]


# ------------------------------------------------------------------------------------- --int-range (no TF)


def test_int_range_flags_over_found_ranges():
    from exportkit.inputs.ranges import IntRanges, parse_int_range_flags, resolve_int_ranges
    from exportkit.errors import UsageError

    found = IntRanges(by_input={"tokens": (0, 50), "segments": (0, 2)})
    keys = ["tokens", "segments", "count"]
    kept = resolve_int_ranges(parse_int_range_flags([]), keys, found)  # nothing given: what was derived (or recorded), else the default
    assert kept.by_input == {"tokens": (0, 50), "segments": (0, 2), "count": (0, 10)}
    one = resolve_int_ranges(parse_int_range_flags(["tokens=0:30"]), keys, found)
    assert (one.of("tokens"), one.of("segments"), one.of("count")) == ((0, 30), (0, 2), (0, 10))
    plain = resolve_int_ranges(parse_int_range_flags(["0:5", "segments=0:2"]), keys, found)  # the plain range sets every other input
    assert (plain.of("tokens"), plain.of("segments"), plain.of("count")) == ((0, 5), (0, 2), (0, 5))
    with pytest.raises(UsageError, match="names mask, which is not an integer input") as err:
        resolve_int_ranges(parse_int_range_flags(["mask=0:2"]), keys, found)
    assert "tokens, segments, count" in err.value.remedy
    with pytest.raises(UsageError, match="no input name"):
        resolve_int_ranges(parse_int_range_flags(["=0:2"]), keys)
    assert IntRanges.from_manifest(one.to_manifest()) == one
    assert IntRanges.from_manifest({"int_range": "0:7"}) == IntRanges((0, 7))  # an export before per-input ranges


def test_generated_batches_draw_each_input_from_its_range():
    from exportkit.inputs.generate import generate_batches
    from exportkit.inputs.ranges import IntRanges
    from exportkit.inputs.spec import InputSpec

    specs = [InputSpec("tokens", "int32", [-1, 6]), InputSpec("segments", "int64", [-1, 6]),
             InputSpec("x", "float32", [-1, 2])]
    _, big = generate_batches(specs, 200, seed=1, int_range=IntRanges((0, 10), {"tokens": (3, 50),
                                                                                 "segments": (0, 2)}))
    assert big["tokens"].min() == 3 and big["tokens"].max() == 49
    assert set(big["segments"].ravel()) == {0, 1}


# ------------------------------------------------------------------------- plain Keras, several vocabularies


def _vocabularies_model():
    """Integer inputs of five kinds: token ids (7-row embedding), a 0/1 attention mask, a country (one-hot of 3),
    an hour (multi-hot of 24) and a bucket id (IntegerLookup: any value is fine)."""
    import keras

    word = keras.Input((6,), dtype="int32", name="word")
    mask = keras.Input((6,), dtype="int32", name="mask")
    country = keras.Input((1,), dtype="int64", name="country")
    hour = keras.Input((1,), dtype="int32", name="hour")
    bucket = keras.Input((1,), dtype="int32", name="bucket")
    w = keras.layers.Embedding(7, 4, name="word_emb")(word)
    w = keras.layers.MultiHeadAttention(2, 2, name="mha")(w, w, attention_mask=keras.ops.expand_dims(mask, 1))
    c = keras.layers.CategoryEncoding(3, output_mode="one_hot", name="country_1hot")(country)
    h = keras.layers.CategoryEncoding(24, output_mode="multi_hot", name="hour_hot")(hour)
    b = keras.ops.cast(keras.layers.IntegerLookup(vocabulary=[3, 5, 9], name="bucket_ids")(bucket), "float32")
    x = keras.layers.Concatenate()([keras.layers.GlobalAveragePooling1D()(w), c, h, b])
    return keras.Model([word, mask, country, hour, bucket], keras.layers.Dense(2, name="score")(x))


@pytest.fixture(scope="module")
def vocabularies(tmp_path_factory):
    path = tmp_path_factory.mktemp("vocab") / "vocabularies.keras"
    model = _vocabularies_model()
    model.save(path)
    return model, path


def test_ranges_derived_from_embedding_one_hot_bincount_and_mask(vocabularies):
    from exportkit.sources.int_ranges import derive_int_ranges
    from exportkit.sources.model_io import model_input_specs

    model, _ = vocabularies
    assert derive_int_ranges(model, model_input_specs(model, [])) == {
        "word": (0, 7), "mask": (0, 2), "country": (0, 3), "hour": (0, 24)}  # bucket: a lookup takes anything


def test_an_additive_attention_mask_is_a_mask():
    """Hugging Face's TF models add `(1.0 - mask) * -10000.0` to attention scores: 0/1 is what the mask means."""
    import keras

    from exportkit.sources.int_ranges import derive_int_ranges
    from exportkit.sources.model_io import model_input_specs

    ids, mask, shift = (keras.Input((6,), dtype="int32", name=n) for n in ("ids", "mask", "shift"))
    scores = keras.ops.sum(keras.layers.Embedding(7, 4)(ids), axis=-1)
    bias = (1.0 - keras.ops.cast(mask, "float32")) * -10000.0
    other = 2.0 - keras.ops.cast(shift, "float32")  # not `1 - x`: bounds nothing
    model = keras.Model([ids, mask, shift], scores + bias + other)
    assert derive_int_ranges(model, model_input_specs(model, [])) == {"ids": (0, 7), "mask": (0, 2)}


@pytest.mark.slow
def test_several_vocabularies_export_and_verify_with_no_flags(vocabularies, tmp_path):
    _, src = vocabularies
    r = invoke("export", src, "-o", tmp_path / "m")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "integers: word=0:7, mask=0:2, country=0:3, hour=0:24, bucket=0:10" in r.stderr
    assert "input   word                     int32     [-1, 6]" in r.stdout
    golden = json.loads((tmp_path / "m/1/assets.extra/exportkit/manifest.json").read_text())["golden"]
    assert golden["int_ranges"] == {"word": "0:7", "mask": "0:2", "country": "0:3", "hour": "0:24", "bucket": "0:10"}
    r = invoke("verify", tmp_path / "m", "--serving", "none", "--runtimes", "golden,saved_model")
    assert r.returncode == 0 and "generated-inputs-rejected" not in r.stdout, r.stdout + r.stderr
    # one input set by hand, the others still derived; verify over the recorded ranges with one changed
    r = invoke("export", src, "-o", tmp_path / "m", "--int-range", "bucket=100:200", "--no-verify")
    assert r.returncode == 0 and "word=0:7, mask=0:2, country=0:3, hour=0:24, bucket=100:200" in r.stderr, r.stderr
    r = invoke("verify", tmp_path / "m", "--serving", "none", "--runtimes", "golden,saved_model", "--int-range",
               "word=0:99")  # out of the 7-row embedding: the SavedModel's gather refuses them
    assert "generated-inputs-rejected" in r.stdout and "not in [0, 7)" in r.stdout, r.stdout + r.stderr


# ------------------------------------------------------------------------------- contracts (plain Keras)

CUSTOM = '''
import keras
from keras import ops


@keras.saving.register_keras_serializable(package="t23")
class Widened(keras.layers.Layer):
    """Stores a derived attribute under the argument's name, returns the argument: correct."""

    def __init__(self, units=2, key_dim=None, **kwargs):
        super().__init__(**kwargs)
        self.requested, self.units = units, 2 * units
        self.key_dim = key_dim or 3  # a None default resolved here, returned resolved: correct too

    def build(self, shape):
        self.w = self.add_weight(shape=(shape[-1], self.units + self.key_dim))

    def call(self, x):
        return ops.matmul(x, self.w)

    def get_config(self):
        return {**super().get_config(), "units": self.requested, "key_dim": self.key_dim}


@keras.saving.register_keras_serializable(package="t23")
class Gate(keras.layers.Layer):
    """Called as gate(x, gate=g, training=...): keyword tensors. `complete=False` forgets `bias`."""

    def __init__(self, bias=0.0, complete=True, **kwargs):
        super().__init__(**kwargs)
        self.bias, self.complete = bias, complete

    def call(self, x, gate=None, training=None):
        return x * ops.sigmoid(gate + self.bias)

    def get_config(self):
        extra = {"bias": self.bias} if self.complete else {}
        return {**super().get_config(), "complete": self.complete, **extra}


@keras.saving.register_keras_serializable(package="t23")
class OneShot(keras.layers.Layer):
    """Works when the model runs it, refuses a third call: the check cannot replay it."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.calls = 0

    def call(self, x):
        self.calls += 1
        if self.calls > 2:
            raise RuntimeError("called more often than the model calls it")
        return x


def build(complete=True, one_shot=False):
    x = keras.Input((4,), name="x")
    g = keras.Input((4,), name="g")
    h = Gate(0.7, complete, name="gate")(x, gate=g)
    h = Widened(2, name="widened")(h)
    if one_shot:
        h = OneShot(name="once")(h)
    return keras.Model([x, g], keras.layers.Dense(1, name="y")(h))
'''


@pytest.fixture(scope="module")
def custom(tmp_path_factory):
    import importlib.util

    path = tmp_path_factory.mktemp("t23") / "t23layers.py"
    path.write_text(textwrap.dedent(CUSTOM))
    spec = importlib.util.spec_from_file_location("t23layers", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _contracts(model, custom_objects=None):
    from exportkit.inputs.generate import generate_batches
    from exportkit.sources.contracts import check_contracts
    from exportkit.sources.model_io import model_input_specs
    from exportkit.compare.outputs import compare_with_default_tolerances

    batches = generate_batches(model_input_specs(model, []), samples=4, seed=0)
    return check_contracts(model, batches, custom_objects or {}, compare=compare_with_default_tolerances)


def test_derived_attributes_and_keyword_tensors_pass(custom):
    assert _contracts(custom.build()) == []


def test_a_forgotten_argument_of_a_keyword_called_layer_is_caught(custom):
    findings = {(f.severity, f.code, f.message.split(":")[0]) for f in _contracts(custom.build(complete=False))}
    assert findings == {("error", "custom-config-incomplete", "Gate 'gate'"),
                        ("error", "custom-config-roundtrip", "Gate 'gate'")}


def test_a_layer_the_check_cannot_replay_is_info(custom):
    findings = _contracts(custom.build(one_shot=True))
    assert [(f.severity, f.code) for f in findings] == [("info", "custom-config-unchecked")]
    assert "fails on the original layer too" in findings[0].message


# ------------------------------------------------------------------------------------------- keras-hub


@pytest.fixture(scope="module")
def hub():
    return pytest.importorskip("keras_hub", reason="keras-hub is not installed (pip install -e '.[dev]')")


@pytest.fixture(scope="module")
def corpus(hub, tmp_path_factory):
    """name -> .keras file of each tiny keras-hub model (tests/kerashub_corpus.py)."""
    import keras

    from kerashub_corpus import CORPUS

    folder = tmp_path_factory.mktemp("kerashub")
    keras.utils.set_random_seed(0)
    saved = {}
    for name, build in CORPUS.items():
        build(hub).save(folder / f"{name}.keras")
        saved[name] = folder / f"{name}.keras"
    return saved


@pytest.mark.slow
@pytest.mark.parametrize("name", ["bert", "gpt2", "gemma", "vit", "bert_classifier"])
def test_kerashub_model_exports_and_verifies_with_no_flags(corpus, tmp_path, name):
    base = tmp_path / name
    r = invoke("export", corpus[name], "-o", base)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "warning" not in r.stdout + r.stderr  # no contract finding, not even with --allow-incomplete-config
    if name != "vit":
        assert "token_ids=0:" in r.stderr and "padding_mask=0:2" in r.stderr, r.stderr
        assert "input   padding_mask             int32     [-1, -1]" in r.stdout  # the written signature's shape
    runtimes = "golden,saved_model,session" if name == "bert" else "golden,saved_model"
    r = invoke("verify", base, "--serving", "none", "--runtimes", runtimes)
    assert r.returncode == 0 and "generated-inputs-rejected" not in r.stdout, r.stdout + r.stderr


@pytest.mark.slow
def test_kerashub_bert_ranges_inspect_and_custom_objects(corpus):
    from exportkit.sources.load import import_custom_objects

    r = invoke("inspect", corpus["bert"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "segment_ids              int32     [-1, -1]  values 0:2" in r.stdout
    assert "token_ids                int32     [-1, -1]  values 0:50" in r.stdout
    r = invoke("inspect", corpus["bert"], "--int-range", "0:50")  # was exit 3; now a clear usage error
    assert r.returncode == 2 and "--int-range NAME=LO:HI" in r.stderr and "segment_ids=0:50" in r.stderr, r.stderr
    objects = import_custom_objects(["keras_hub"])  # registered from keras_hub's submodules
    assert {"BertBackbone", "TransformerEncoder", "GPT2Backbone"} <= set(objects)
    r = invoke("export", corpus["bert"], "-o", corpus["bert"].parent / "with_flag", "--custom-objects", "keras_hub",
               "--no-verify")
    assert r.returncode == 0, r.stdout + r.stderr


def test_kerashub_layer_called_with_a_padding_mask_keyword_passes_the_contract_check(hub):
    """keras_hub.layers in a plain functional graph: stored in its config, so checked, and replayed with
    `padding_mask=` as a keyword (it was replayed with layer.input, positionally, and refused)."""
    import keras

    tokens = keras.Input((None,), dtype="int32", name="token_ids")
    mask = keras.Input((None,), dtype="int32", name="padding_mask")
    x = hub.layers.TokenAndPositionEmbedding(50, 16, 16, name="embed")(tokens)
    x = hub.layers.TransformerEncoder(32, 2, name="encoder")(x, padding_mask=mask)
    x = hub.layers.TransformerDecoder(32, 2, name="decoder")(x, decoder_padding_mask=mask)
    model = keras.Model([tokens, mask], keras.layers.Dense(2, name="y")(x))
    from exportkit.inputs.generate import generate_batches
    from exportkit.inputs.ranges import IntRangeFlags
    from exportkit.sources.contracts import check_contracts, custom_objects_of
    from exportkit.sources.int_ranges import int_ranges_for
    from exportkit.sources.model_io import model_input_specs
    from exportkit.compare.outputs import compare_with_default_tolerances

    assert {o.name for o in custom_objects_of(model)} == {"embed", "encoder", "decoder"}
    specs = model_input_specs(model, [])
    batches = generate_batches(specs, samples=4, seed=0, int_range=int_ranges_for(model, specs, IntRangeFlags()))
    assert check_contracts(model, batches, {}, compare=compare_with_default_tolerances) == []
