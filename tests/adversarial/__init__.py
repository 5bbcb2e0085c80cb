"""Hardening corpus (issue 10): SavedModels written by others, hostile input and faults, all built at test time."""
