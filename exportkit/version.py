"""The package version, at the bottom of the layers: whatever records it imports it from here (pyproject.toml
reads it too). Bumped by what changed: see CHANGELOG.md."""
__version__ = "0.6.0"
