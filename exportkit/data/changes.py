"""Streaming statistics of what changes between two model versions on the same records (`exportkit diff`).

One `ChangeStats` per output takes batch after batch of (old answers, new answers) and holds a fixed amount of
memory; two of them merge exactly (Beam's CombineFn merges them the same way), as compare.stats.OutputStats do:

* per element: |new - old| and |new - old| / |old| in compare.stats' LogHistogram (quantiles within 1.2%), the exact
  maximum, and the mean shift (mean of new - old);
* the records that changed most (their largest element change), with file, index, element and both values;
* for a top-1 output (`KEY/top1`, derived by runtimes.wrappers.Top1Outputs): the records whose top-1 changed, and the counts of
  (old top-1, new top-1) pairs, bounded at MAX_PAIRS distinct pairs (the rest counted as `other`);
* with a label (a feature of the records' tf.Examples, `label_key`): each version's metric: accuracy of a top-1
  output, AUC of a one-value score against 0/1 labels (from AUC_BINS bins of a monotonic squashing of the score,
  so the AUC is exact up to ties within a bin), and mean squared error of a one-value output.
"""
from __future__ import annotations

import math
from collections import Counter

import numpy as np

from exportkit.compare.stats import LogHistogram, to_bytes
from exportkit.runtimes.wrappers import TOP1

MOST_CHANGED = 10
MAX_PAIRS = 10_000
AUC_BINS = 20_000


def labels_of(examples: np.ndarray | None, key: str) -> np.ndarray | None:
    """The first value of feature `key` of each serialized tf.Example (None where a record lacks it)."""
    if examples is None:
        return None
    from tensorflow.core.example import example_pb2

    values = np.empty(len(examples), dtype=object)
    for i, raw in enumerate(examples):
        feature = example_pb2.Example.FromString(bytes(raw)).features.feature.get(key)
        kind = feature.WhichOneof("kind") if feature is not None else None
        listed = getattr(feature, kind).value if kind else []
        values[i] = listed[0] if len(listed) else None
    return values


def _same(top: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """top-1 == label, a class index or label string against an int64 or bytes feature."""
    return np.asarray([t is not None and lab is not None and to_bytes(t) == to_bytes(lab)
                       for t, lab in zip(top, labels)], dtype=bool)


def _squash(values: np.ndarray) -> np.ndarray:
    """A monotonic map of the reals into [0, 1) bins (monotonic: the AUC of the bins is the scores' AUC)."""
    u = 0.5 + np.arctan(np.asarray(values, dtype=np.float64)) / math.pi
    return np.clip((u * AUC_BINS).astype(np.int64), 0, AUC_BINS - 1)


class _Metric:
    """One version's metric accumulators against the labels."""

    def __init__(self):
        self.n = self.correct = 0
        self.sq = 0.0
        self.binary = True
        self.pos, self.neg = np.zeros(AUC_BINS, np.int64), np.zeros(AUC_BINS, np.int64)

    def add_top1(self, top: np.ndarray, labels: np.ndarray) -> None:
        known = np.asarray([lab is not None for lab in labels], dtype=bool)
        self.n += int(known.sum())
        self.correct += int(_same(top[known], labels[known]).sum())

    def add_value(self, values: np.ndarray, labels: np.ndarray) -> None:
        known = np.asarray([lab is not None and not isinstance(lab, bytes) for lab in labels], dtype=bool)
        if not known.any():
            return
        v = np.asarray(values, dtype=np.float64)[known]
        y = np.asarray(list(labels[known]), dtype=np.float64)
        self.n += len(v)
        self.sq += float(((v - y) ** 2).sum())
        positive = y == 1
        self.binary = self.binary and bool(np.all((y == 0) | positive))
        bins = _squash(v)
        self.pos += np.bincount(bins[positive], minlength=AUC_BINS)
        self.neg += np.bincount(bins[~positive], minlength=AUC_BINS)

    def merge(self, other: "_Metric") -> None:
        self.n += other.n
        self.correct += other.correct
        self.sq += other.sq
        self.binary = self.binary and other.binary
        self.pos += other.pos
        self.neg += other.neg

    def auc(self) -> float | None:
        p, q = int(self.pos.sum()), int(self.neg.sum())
        if not p or not q:
            return None
        below = np.cumsum(self.neg) - self.neg  # negatives in lower bins
        return float((self.pos * (below + 0.5 * self.neg)).sum() / (p * q))

    def __getstate__(self):  # Beam pickles accumulators: the non-zero bins only
        state = dict(self.__dict__)
        for name in ("pos", "neg"):
            nz = np.flatnonzero(state[name])
            state[name] = (nz, state[name][nz])
        return state

    def __setstate__(self, state):
        for name in ("pos", "neg"):
            nz, counts = state[name]
            full = np.zeros(AUC_BINS, np.int64)
            full[nz] = counts
            state[name] = full
        self.__dict__.update(state)


class ChangeStats:
    """One output's changes from the old version's answers to the new one's (see the module docstring).

    The constructor takes (key, atol, rtol) as compare.stats.OutputStats does (Beam builds either the same way); the
    tolerances are not used: a diff measures change, the gates judge it."""

    def __init__(self, key: str, atol: float = 0.0, rtol: float = 0.0, label_key: str | None = None):
        self.key, self.label_key = key, label_key
        self.top1 = key.endswith(TOP1)
        self.dtype = None
        self.records = self.elements = self.changed = 0
        self.structural: list[str] = []
        self.max_abs = None
        self.sum_shift = 0.0
        self.abs_hist, self.rel_hist = LogHistogram(), LogHistogram()
        self.most: list[tuple] = []  # (abs change, file_no, index, offset, element, old, new)
        self.pairs: Counter = Counter()
        self.other_pairs = 0
        self.metrics = (_Metric(), _Metric())
        self.per_record = None  # elements per record (1: a scalar output, whose metric is AUC or MSE)

    def add(self, old, new, file_nos, indices, offsets, examples=None) -> None:
        n = len(indices)
        file_nos = np.broadcast_to(np.asarray(file_nos), (n,))
        self.records += n
        if old is None or new is None:
            self.structural = sorted({*self.structural, "only in the new version" if old is None
                                      else "missing in the new version"})
            return
        o, w = np.asarray(old), np.asarray(new)
        if o.shape != w.shape or not o.ndim or o.shape[0] != n:
            self.structural = sorted({*self.structural, f"shape {tuple(w.shape)} != {tuple(o.shape)}"})[:3]
            return
        labels = labels_of(examples, self.label_key) if self.label_key else None
        self.dtype = self.dtype or o.dtype.name
        if self.top1 or o.dtype.kind in "OSUb":
            self._add_categorical(o, w, file_nos, indices, offsets, labels)
        else:
            self._add_numeric(o, w, file_nos, indices, offsets, labels)

    def _add_categorical(self, o, w, file_nos, indices, offsets, labels) -> None:
        flat_o, flat_w = o.reshape(len(o), -1), w.reshape(len(w), -1)
        differs = np.asarray(flat_o != flat_w, dtype=bool).reshape(flat_o.shape)  # bytes, ints or bools alike
        self.elements += differs.size
        self.changed += int(differs.any(axis=1).sum())
        if self.top1:
            for (a, b), count in Counter(zip(flat_o[:, 0].tolist(), flat_w[:, 0].tolist())).items():
                self._count_pair((_plain(a), _plain(b)), count)
            if labels is not None:
                self.metrics[0].add_top1(flat_o[:, 0], labels)
                self.metrics[1].add_top1(flat_w[:, 0], labels)
        rows = np.flatnonzero(differs.any(axis=1))[:MOST_CHANGED]
        for r in rows:
            el = int(np.argmax(differs[r]))
            self.most.append((math.inf, int(file_nos[r]), int(indices[r]), int(offsets[r]), [el],
                              _plain(flat_o[r, el]), _plain(flat_w[r, el])))
        self._trim()

    def _add_numeric(self, o, w, file_nos, indices, offsets, labels) -> None:
        of, wf = o.astype(np.float64).reshape(len(o), -1), w.astype(np.float64).reshape(len(w), -1)
        self.per_record = of.shape[1]
        with np.errstate(all="ignore"):
            diff = wf - of
            finite = np.isfinite(diff)
            absd = np.where(finite, np.abs(diff), 0.0)
            changed_nonfinite = ~finite & ~((np.isnan(of) & np.isnan(wf)) | (of == wf))
        self.elements += diff.size
        self.changed += int(((absd > 0) | changed_nonfinite).any(axis=1).sum())
        if absd.size:
            self.max_abs = max(self.max_abs or 0.0, float(absd.max()))
            self.sum_shift += float(np.where(finite, diff, 0.0).sum())
            self.abs_hist.add(absd[finite])
            mag = np.abs(of)
            nz = finite & (mag > 0)
            self.rel_hist.add(absd[nz] / mag[nz])
            worst = absd.argmax(axis=1)
            record_change = np.where(changed_nonfinite.any(axis=1), math.inf, absd[np.arange(len(absd)), worst])
            for r in np.lexsort((np.arange(len(record_change)), -record_change))[:MOST_CHANGED]:
                if record_change[r] <= 0:
                    break
                el = int(worst[r])
                self.most.append((float(record_change[r]), int(file_nos[r]), int(indices[r]), int(offsets[r]),
                                  [int(i) for i in np.unravel_index(el, o.shape[1:])] if o.ndim > 1 else [],
                                  float(of[r, el]), float(wf[r, el])))
            self._trim()
        if labels is not None and of.shape[1] == 1:
            self.metrics[0].add_value(of[:, 0], labels)
            self.metrics[1].add_value(wf[:, 0], labels)

    def _count_pair(self, pair: tuple, count: int) -> None:
        if pair in self.pairs or len(self.pairs) < MAX_PAIRS:
            self.pairs[pair] += count
        else:
            self.other_pairs += count

    def _trim(self) -> None:
        self.most.sort(key=lambda m: (-m[0], m[1], m[2]))
        del self.most[MOST_CHANGED:]

    def merge(self, other: "ChangeStats") -> "ChangeStats":
        self.dtype = self.dtype or other.dtype
        self.per_record = self.per_record or other.per_record
        self.structural = sorted({*self.structural, *other.structural})[:3]
        for name in ("records", "elements", "changed", "other_pairs"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        values = [v for v in (self.max_abs, other.max_abs) if v is not None]
        self.max_abs = max(values) if values else None
        self.sum_shift += other.sum_shift
        self.abs_hist.merge(other.abs_hist)
        self.rel_hist.merge(other.rel_hist)
        for pair, count in other.pairs.items():
            self._count_pair(pair, count)
        for mine, theirs in zip(self.metrics, other.metrics):
            mine.merge(theirs)
        self.most += other.most
        self._trim()
        return self

    # -- the results ------------------------------------------------------------------------------------------

    @property
    def mean_shift(self) -> float | None:
        return self.sum_shift / self.elements if self.elements and not self.top1 and self.max_abs is not None else None

    def metric(self, regression: bool) -> tuple[str, float | None, float | None] | None:
        """(name, old, new) against the labels, None without any: accuracy (top-1), AUC (a one-value score,
        0/1 labels, not a regression signature) or MSE."""
        old, new = self.metrics
        if not old.n:
            return None
        if self.top1:
            return "accuracy", old.correct / old.n, new.correct / new.n
        if old.binary and not regression:
            return "auc", old.auc(), new.auc()
        return "mse", old.sq / old.n, new.sq / new.n

    def confusion(self, top: int = 10) -> dict:
        """The old x new top-1 counts among the `top` most frequent old classes (and the new ones they became)."""
        by_old, by_new = Counter(), Counter()
        for (a, b), count in self.pairs.items():
            by_old[a] += count
            by_new[b] += count
        classes = [c for c, _ in by_old.most_common(top)]
        classes += [c for c, _ in by_new.most_common(top) if c not in classes][:max(0, top - len(classes))]
        return {"classes": classes,
                "counts": [[self.pairs.get((a, b), 0) for b in classes] for a in classes],
                "other": self.records - sum(self.pairs.get((a, b), 0) for a in classes for b in classes)}


def _plain(v):
    return to_bytes(v).decode("utf-8", "backslashreplace") if isinstance(v, (bytes, str)) else (
        int(v) if isinstance(v, (np.integer, int)) else float(v) if isinstance(v, (np.floating, float)) else str(v))
