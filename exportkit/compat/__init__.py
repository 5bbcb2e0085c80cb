"""`exportkit compat`: the TF X.Y matrix, predicted from the shipped registries (tfversions/) and observed with
each version's TF1 loader or TF Serving (--run); command.py runs it, report.py renders it."""
