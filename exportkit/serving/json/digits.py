"""Tables the numpy number writers share (fixed.py's fixed-width layout, encode.py's float texts)."""
from __future__ import annotations

import numpy as np

FOUR_DIGITS = np.frombuffer(b"".join(b"%04d" % i for i in range(10000)), "<u4")  # ASCII, as a word holds them
TEN_TO = np.array([float(f"1e{k}") for k in range(-60, 61)])  # 10**k at k + 60, for the encoders' scaling
