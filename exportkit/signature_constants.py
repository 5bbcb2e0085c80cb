"""TF Serving's signature constants: the tag, keys and method names that pick its API (mirrors TensorFlow's
python/saved_model/signature_constants.py and tag_constants.py; tensorflow/cc/saved_model/signature_constants.h).

Ground knowledge: options, the serving mirrors and the SavedModel readers all name them, so they live below all.
"""
SERVE_TAG = "serve"  # the MetaGraph tag TF Serving loads
DEFAULT_SIGNATURE = "serving_default"  # what TF Serving uses when a request names no signature
INIT_OP_SIGNATURE = "__saved_model_init_op"  # TF's table/asset initializer: not servable, hidden by default

# SignatureDef method names: they pick TF Serving's API.
PREDICT_METHOD = "tensorflow/serving/predict"
CLASSIFY_METHOD = "tensorflow/serving/classify"
REGRESS_METHOD = "tensorflow/serving/regress"

# Input and output keys TF Serving's Classify and Regress require (kClassifyInputs, ...).
CLASSIFY_INPUTS, CLASSIFY_CLASSES, CLASSIFY_SCORES = "inputs", "classes", "scores"
REGRESS_INPUTS, REGRESS_OUTPUTS = "inputs", "outputs"
