"""`inspect` of a SavedModel with a million nodes finishes and reports what is there (issue 48: it took 29-38 s
and 963 MB when every check walked the graph again). No time is asserted; the report stays small."""
from __future__ import annotations

import json

import pytest

from conftest import run_cli
from large_graph import write_large_savedmodel

NODES = 1_000_000


@pytest.mark.slow
def test_inspect_of_a_million_nodes_reports_them_once(tmp_path):
    version_dir = write_large_savedmodel(tmp_path / "big" / "1", NODES)
    result = run_cli("inspect", version_dir, "--json", env={"EXPORTKIT_CACHE_DIR": str(tmp_path / "cache")})
    assert result.returncode == 0, result.stderr
    assert len(result.stdout) < 20_000  # one line per op type and finding, never one per node
    info = json.loads(result.stdout)
    steps = NODES - 2
    assert info["ops"] == {"AddV2": (steps + 1) // 2, "Const": 1, "Identity": steps // 2, "Placeholder": 1}
    assert sum(info["ops"].values()) == NODES
    outputs = info["signatures"]["serving_default"]["outputs"]
    assert outputs["y"]["name"] == f"n{steps - 1}:0"
    assert [f for f in info["findings"] if f["severity"] == "error"] == []
