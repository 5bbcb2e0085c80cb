"""`exportkit export`: a Keras source -> a TF Serving version directory, in the order the data flows:
signature (named signatures) -> golden (the golden record) -> manifest -> writer (atomic staging) ->
selfcheck (the TF1 loader's verdict) -> report; pipeline.py strings the steps together."""
