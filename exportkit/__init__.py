"""exportkit: export Keras/TensorFlow models for TF Serving and prove they compute what the model computed."""
from exportkit.version import __version__  # noqa: F401  (exportkit.__version__)

# The package is the Python API, at the top of the layers beside the CLI: it imports lazily, so that importing
# any exportkit module (which runs this file first) stays as cheap as that module.


def record_reference(model, path, inputs=None, samples=8, seed=0, int_range=None):
    """Write the inputs and the eager outputs of `model` as trained to `path` (one .npz, no pickle).

    Call it in the training script, right after training; `exportkit export` and `verify` then prove the export
    computes what this process computed. Imports only what the training script already has (TensorFlow, Keras).
    Generated inputs follow export's rules (batches of 1 and `samples` rows, integers in the ranges derived
    from the model, or `int_range`: LO:HI for every integer input, NAME=LO:HI for one, a string or a list).
    """
    from exportkit.reference import record_reference as record

    return record(model, path, inputs=inputs, samples=samples, seed=seed, int_range=int_range)
