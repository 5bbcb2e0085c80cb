"""`exportkit inspect`: a SavedModel's signatures, ops, assets and findings read from saved_model.pb without
TensorFlow (command.py), rendered by report.py; a model source is described by sources/describe.py."""
