"""tf.Example: the features (one definition, derived from a model's inputs or read from a graph's parse ops),
the signatures that parse them, and the parser the runtimes use on records."""
