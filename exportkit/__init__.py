"""exportkit: export Keras/TensorFlow models for TF Serving and prove they compute what the model computed."""
__version__ = "0.1.0"
