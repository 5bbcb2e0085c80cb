"""Small but realistic sample models in every source format exportkit supports.

Build them with `python sample_models/build_samples.py --out DIR` (or `build_all(out_dir)`); DIR/samples.json
lists each sample's path, format, the `exportkit export` flags it needs, its dtype policy and notes.
"""
