"""tf.keras 2 (tf_keras) models written the way their users write them, and the ecosystem's SavedModels (issue 30)."""
