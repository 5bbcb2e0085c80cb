"""The package version, at the bottom of the layers: whatever records it imports it from here."""
__version__ = "0.1.0"
