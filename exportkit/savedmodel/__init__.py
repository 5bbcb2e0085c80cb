"""Knowledge of a SavedModel on disk, read without TensorFlow: protos, the MetaGraph (reader), version
directories (versions), SignatureDefs, the version dir's extras (layout, manifest), one graph walker (graph) for
lint, deployment and compat analysis, checkpoints; and the TF1 loader (loader) that loads it as TF Serving does."""
