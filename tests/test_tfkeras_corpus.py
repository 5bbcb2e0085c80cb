"""tf.keras 2 (tf_keras) sources export and verify as their users run exportkit (issue 30); the ecosystem's own
SavedModels: test_tfkeras_ecosystem.py.

The corpus (tests/tfkeras_corpus/) is built once per session, one training process per flavour, on first use.
Every command runs in a subprocess in the entry's environment (TF_USE_LEGACY_KERAS set or not), as a user runs it.
`python -m tests.tfkeras_corpus.measure` runs the same commands and prints the table.
"""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from tests.tfkeras_corpus import builders as b
from tests.tfkeras_corpus.measure import exportkit, missing_verdict, said

pytestmark = pytest.mark.slow


# `make test` runs these (one per way of writing a source: a TF 2.x-era .h5 with custom layers, a tf_keras
# .weights.h5 with its builder, a Keras 2 SavedModel, an .h5 written by TF 2.12's own Keras); the whole corpus is
# `make test-corpus` (marker `corpus`): about 40 s an entry.
CORE = ("tf2x_ranker_mixed_h5", "tfkeras_gated_mixed_weights_h5", "tfkeras_sentiment_savedmodel", "tf212_norm_h5")


def _param(entry: b.Entry):
    marks = [pytest.mark.compat] if entry.flavour == "tf212" else []
    if entry.name not in CORE:
        marks.append(pytest.mark.corpus)
    return pytest.param(entry, id=entry.name, marks=marks)


@pytest.fixture(scope="session")
def tfkeras_corpus(tmp_path_factory):
    """corpus(entry) -> its Built, its flavour's training script run on first use (one process per flavour)."""
    root = tmp_path_factory.mktemp("tfkeras-corpus")
    failed: dict[str, str] = {}  # flavour -> why its training script failed (said once, not retried)

    def get(entry: b.Entry) -> b.Built:
        flavour = b.FLAVOURS[entry.flavour]
        if entry.flavour not in b.available_flavours():
            pytest.skip(f"{flavour.what}: its Python ({flavour.python}) is not installed "
                        "(`exportkit runtimes install 2.12`)")
        if not (root / entry.flavour).exists():
            try:
                b.build_flavour(root, entry.flavour)
            except RuntimeError as err:
                failed[entry.flavour] = str(err)
        assert entry.flavour not in failed, failed[entry.flavour]
        return b.Built(entry, root)

    return get


@pytest.fixture(scope="session")
def tfkeras_export(tfkeras_corpus, tmp_path_factory):
    """export(entry) -> the entry exported once per session with the user's command line (plus --json FILE):
    `.built`, `.proc`, `.out` (the base directory), `.summary` (export's JSON summary, None if it failed)."""
    root = tmp_path_factory.mktemp("tfkeras-exports")
    done: dict[str, SimpleNamespace] = {}

    def get(entry: b.Entry) -> SimpleNamespace:
        if entry.name not in done:
            built = tfkeras_corpus(entry)
            out, summary = root / entry.name, root / f"{entry.name}.json"
            proc = exportkit(built.export_args(out) + ["--json", str(summary)], built.env())
            done[entry.name] = SimpleNamespace(built=built, proc=proc, out=out, summary=json.loads(
                summary.read_text()) if proc.returncode == 0 and summary.exists() else None)
        return done[entry.name]

    return get


# ------------------------------------------------------------------------------------------- the sources
@pytest.mark.parametrize("entry", [_param(e) for e in b.ENTRIES])
def test_the_source_exports_with_the_users_flags(tfkeras_export, entry):
    """`exportkit export SRC -o OUT` with only --python-path, --custom-objects, --builder (and --policy/--keras
    where the entry's user passes them): exit 0, the named inputs, the model's policy, float32 outputs, and the
    training-time reference the script recorded next to the source."""
    done = tfkeras_export(entry)
    assert done.proc.returncode == 0, (done.built.command_line(done.out), said(done.proc, 6))
    assert "Traceback" not in done.proc.stderr
    summary = done.summary
    assert summary["self_check"] == "passed", summary
    if entry.inputs is not None:
        assert {k: v["dtype"] for k, v in summary["inputs"].items()} == entry.inputs, summary["inputs"]
    assert summary["dtype_policy"] == entry.policy, summary
    assert bool(summary["reference"]) == entry.reference, summary["reference"]  # the training script's record
    assert set(summary["outputs"]) and all(o["dtype"] == "float32" for o in summary["outputs"].values()), summary


@pytest.mark.parametrize("entry", [_param(e) for e in b.ENTRIES])
def test_the_export_verifies_against_its_source(tfkeras_export, entry):
    """`exportkit verify OUT --against SRC` with the same flags: eager tf_keras (the `keras` runtime) is run and
    agrees with the reloaded SavedModel. (The export's own self-check ran the TF1 loader; the servers do not
    depend on which Keras wrote the source, so they are left out to keep this cheap.)"""
    done = tfkeras_export(entry)
    assert done.proc.returncode == 0, f"no export to verify: {said(done.proc)}"
    verify = exportkit(done.built.verify_args(done.out) + ["--runtimes", "keras,saved_model", "--json", "-"],
                       done.built.env())
    assert verify.returncode == 0, said(verify, 12)
    rows = {r["name"]: r for r in json.loads(verify.stdout)["runtimes"]}
    assert rows["keras"]["status"] == "ok" and rows["keras"]["passed"], rows["keras"]
    assert rows["saved_model"]["status"] == "ok" and rows["saved_model"]["passed"], rows["saved_model"]


@pytest.mark.parametrize("entry", [_param(e) for e in b.ENTRIES if e.missing])
def test_missing_custom_objects_name_the_class_and_a_fix_that_works(tfkeras_export, tmp_path, entry):
    """Without --custom-objects: exit 2 naming the class, and the fix line's flag then exports (a .keras records
    the module, so its fix must name it; the entry's own module is judged by the entry's own export)."""
    done = tfkeras_export(entry)
    ok, what = missing_verdict(done.built, tmp_path / entry.name, done.proc.returncode == 0)
    assert ok, what


def _first_of_each_format() -> list[b.Entry]:
    """One entry per flavour and source format (a Keras 2 SavedModel is inspected as the SavedModel it is)."""
    first: dict[tuple[str, str], b.Entry] = {}
    for entry in b.ENTRIES:
        if entry.format != "savedmodel":
            first.setdefault((entry.flavour, entry.format), entry)
    return list(first.values())


@pytest.mark.parametrize("entry", [_param(e) for e in _first_of_each_format()])
def test_inspect_reads_the_source(tfkeras_corpus, entry):
    """`exportkit inspect SRC` (one entry per flavour and format) loads it with its Keras: the inputs and the
    policy the export then gets, no load error."""
    built = tfkeras_corpus(entry)
    got = exportkit(["inspect", *built.source_args(), "--json"], built.env())
    assert got.returncode == 0, said(got, 6)
    info = json.loads(got.stdout)
    assert info["load_error"] is None and not [f for f in info["findings"] if f["severity"] == "error"], info
    if entry.inputs is not None:
        assert {i["key"]: i["dtype"] for i in info["inputs"]} == entry.inputs, info["inputs"]
    assert info["policy"] == entry.policy, info
