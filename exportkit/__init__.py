"""exportkit: export Keras/TensorFlow models for TF Serving and prove they compute what the model computed.

The Python API (docs/python-api.md): `exportkit.export`, `verify`, `inspect`, `compat`, `diff` and `record_reference`, with
the CLI's options as keyword arguments, returning the reports the CLI renders; errors are `ExportkitError`s.
`warm_start()` shares one TensorFlow import among the verifies of one process.
"""
import types as _types

from exportkit import compat as _compat, diff as _diff, export as _export, verify as _verify
from exportkit.errors import ExportkitError, InfraError, UsageError  # noqa: F401  (exportkit.UsageError, ...)
from exportkit.version import __version__  # noqa: F401  (exportkit.__version__)

# The package is the Python API, at the top of the layers beside the CLI: it imports lazily (exportkit/api.py on
# the first call), so that importing any exportkit module (which runs this file first) stays as cheap as that module.


class _CommandPackage(_types.ModuleType):
    """`exportkit.verify` is both the subpackage (exportkit.verify.plan, ...) and the function `exportkit.verify(path)`:
    importing a submodule rebinds the package's attribute to the subpackage, so the subpackage is made callable."""

    def __call__(self, *args, **kwargs):
        from exportkit import api

        return getattr(api, self.__name__.rpartition(".")[2])(*args, **kwargs)


for _package in (_compat, _diff, _export, _verify):
    _package.__class__ = _CommandPackage
del _package


def inspect(path, **options):
    """Signatures, dtypes, shapes, ops, assets and findings of a SavedModel (or a model source's inputs and outputs),
    as `exportkit inspect PATH`. See exportkit.api.inspect."""
    from exportkit import api

    return api.inspect(path, **options)



def record_reference(model, path, inputs=None, samples=8, seed=0, int_range=None):
    """Write the inputs and the eager outputs of `model` as trained to `path` (one .npz, no pickle).

    Call it in the training script, right after training; `exportkit export` and `verify` then prove the export
    computes what this process computed. Imports only what the training script already has (TensorFlow, Keras).
    Generated inputs follow export's rules (batches of 1 and `samples` rows, integers in the ranges derived
    from the model, or `int_range`: LO:HI for every integer input, NAME=LO:HI for one, a string or a list).
    """
    from exportkit.sources.reference import record_reference as record

    return record(model, path, inputs=inputs, samples=samples, seed=seed, int_range=int_range)


def warm_start():
    """A context manager: within it, the CPU TensorFlow workers of `verify` and `diff` fork from one process that
    imported TensorFlow once, ~0.5 s a worker instead of ~3 s; so do those of the processes started inside it (an
    `exportkit verify` subprocess). For a suite or a script that verifies many models; the verdicts are the same as
    without it (exportkit.runtimes.forkserver)."""
    from exportkit.runtimes.forkserver import warm_start as start

    return start()
