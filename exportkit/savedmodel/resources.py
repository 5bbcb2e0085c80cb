"""TF Serving's RAM estimate of a version, computed as its sources compute it, without loading anything.

Before it loads a SavedModel, TF Serving's resource tracker asks for an estimate and admits or refuses the version
on it: `EstimateResourceFromPathUsingDiskState` (servables/tensorflow/util.cc, reached through
bundle_factory_util.cc's EstimateResourceFromPath and oss/resource_estimator.cc; the validation-result path is
`Unimplemented`) sums the size of every file under the version directory, recursively (`GetModelDiskSize`: every
child of every directory, assets and assets.extra included), and multiplies by kResourceEstimateRAMMultiplier = 1.2
plus kResourceEstimateRAMPadBytes = 0, converted to uint64 (truncated). "A crude heuristic": a lookup table built
from a text asset, for one, takes several times its file.
"""
from __future__ import annotations

from pathlib import Path

from exportkit.savedmodel.layout import tree_bytes

RAM_MULTIPLIER = 1.2  # kResourceEstimateRAMMultiplier (servables/tensorflow/util.cc)
RAM_PAD_BYTES = 0  # kResourceEstimateRAMPadBytes

# A version that takes more than ESTIMATE_MARGIN x the estimate, and by more than ESTIMATE_SLACK_BYTES, is flagged
# (docs/verify.md "Memory"). 1.25: the measurement's error (within 5% of an independent one on the tests' models)
# several times over. The slack: any graph takes a session, executors and a graph (~4 MB for a 4x2 matmul), which
# files x 1.2 cannot foresee for small models and which no server is sized on; 4x that.
ESTIMATE_MARGIN = 1.25
ESTIMATE_SLACK_BYTES = 16 * 10**6


def disk_bytes(version_dir: str | Path) -> int:
    """Bytes of every file under the version directory, recursively (GetModelDiskSize; links followed, as
    Env::IsDirectory and GetFileSize follow them)."""
    return tree_bytes(version_dir, follow_links=True)


def ram_estimate(files_bytes: int) -> int:
    """TF Serving's RAM estimate for `files_bytes` of files: uint64(files x 1.2 + 0)."""
    return int(files_bytes * RAM_MULTIPLIER + RAM_PAD_BYTES)


def serving_estimate(version_dir: str | Path) -> dict:
    """{"files_bytes", "estimate_bytes"}: what TF Serving's resource tracker plans for this version."""
    files = disk_bytes(version_dir)
    return {"files_bytes": files, "estimate_bytes": ram_estimate(files)}


def over_estimate(loaded_bytes: int, estimate_bytes: int) -> bool:
    """Whether a measured figure exceeds the estimate by the margin that the measurement's error cannot explain."""
    return loaded_bytes > ESTIMATE_MARGIN * estimate_bytes and loaded_bytes - estimate_bytes > ESTIMATE_SLACK_BYTES
