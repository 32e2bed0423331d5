"""Workload classes: k-means typing of requests on (log input, log output) token counts.

Callers: the planner (``fit_classes`` on a trace, then ``class_rates`` and the token-space
``centroids``), the gateway's router (``WorkloadClasses.classify`` per request, pure numpy) and
the predictor benchmark. Features are ``log1p(tokens)`` (zero outputs are still typed);
scikit-learn is used only to fit. Without a given k: for k in 2..8 (capped by distinct points −
1), k-means on a seeded subsample of at most 3,000 requests, scored by silhouette on it; the
chosen k is the smallest within SILHOUETTE_TOLERANCE (0.01) of the best (docs/workload.md says
why), then fit on all requests. Class ids are stable: sorted by log-space centroid (input, then
output), so class 0 has the shortest prompts.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt
from sklearn.cluster import KMeans
from sklearn.metrics import silhouette_score

from tessera.workload import traces

K_CANDIDATES = range(2, 9)  # k tried by the silhouette criterion when k is not given
SUBSAMPLE = 3000  # points scored by the silhouette criterion
SILHOUETTE_TOLERANCE = 0.01  # the smallest k scoring within this of the best k wins
N_INIT = 10  # k-means restarts (fixed, so results depend only on the seed)
FORMAT_VERSION = 1

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


class Centroid(NamedTuple):
    """A class centre in one space (token counts, or log1p of token counts)."""

    input_tokens: float
    output_tokens: float


@dataclasses.dataclass(frozen=True)
class WorkloadClasses:
    """Fitted request classes; class id = index into the centroid tuples."""

    centroids: tuple[Centroid, ...]  # token space: expm1 of the log-space centroid
    log_centroids: tuple[Centroid, ...]  # log1p space, where distances are measured
    mean_tokens: tuple[Centroid, ...]  # arithmetic mean tokens of each class's fit members
    shares: tuple[float, ...]  # fraction of the fit requests in each class
    seed: int  # k-means random_state
    criterion: str  # how k was chosen: "given" or "silhouette"
    silhouettes: tuple[tuple[int, float], ...] = ()  # (k, score) tried by the criterion

    def __post_init__(self) -> None:
        k = len(self.log_centroids)
        if k < 1:
            raise ValueError("WorkloadClasses needs at least one centroid")
        for name in ("centroids", "mean_tokens", "shares"):
            if len(getattr(self, name)) != k:
                raise ValueError(f"WorkloadClasses.{name} has {len(getattr(self, name))} != {k}")

    @property
    def k(self) -> int:
        """Number of classes."""
        return len(self.log_centroids)

    def classify(self, input_tokens: int, output_tokens: int) -> int:
        """Class of one request: nearest centroid in log1p space (lowest id on ties)."""
        return int(self.classify_many([input_tokens], [output_tokens])[0])

    def classify_many(
        self,
        input_tokens: npt.ArrayLike,
        output_tokens: npt.ArrayLike,
    ) -> IntArray:
        """Classes of many requests (vectorised `classify`)."""
        x = features(input_tokens, output_tokens)
        c = np.asarray(self.log_centroids, dtype=np.float64)
        d2 = ((x[:, None, :] - c[None, :, :]) ** 2).sum(axis=2)
        labels: IntArray = np.argmin(d2, axis=1).astype(np.int64)
        return labels

    def to_json(self) -> dict[str, Any]:
        """A JSON-serialisable dict; `from_json` inverts it exactly."""
        return {
            "version": FORMAT_VERSION,
            "feature": "log1p",
            "centroids": [list(c) for c in self.centroids],
            "log_centroids": [list(c) for c in self.log_centroids],
            "mean_tokens": [list(c) for c in self.mean_tokens],
            "shares": list(self.shares),
            "seed": self.seed,
            "criterion": self.criterion,
            "silhouettes": [[k, s] for k, s in self.silhouettes],
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> WorkloadClasses:
        """Rebuild from `to_json` output; raises ValueError on another version or feature."""
        if obj.get("version") != FORMAT_VERSION or obj.get("feature") != "log1p":
            raise ValueError(
                f"unsupported workload classes: version {obj.get('version')!r}, "
                f"feature {obj.get('feature')!r}"
            )
        return cls(
            centroids=tuple(Centroid(float(a), float(b)) for a, b in obj["centroids"]),
            log_centroids=tuple(Centroid(float(a), float(b)) for a, b in obj["log_centroids"]),
            mean_tokens=tuple(Centroid(float(a), float(b)) for a, b in obj["mean_tokens"]),
            shares=tuple(float(s) for s in obj["shares"]),
            seed=int(obj["seed"]),
            criterion=str(obj["criterion"]),
            silhouettes=tuple((int(k), float(s)) for k, s in obj["silhouettes"]),
        )

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the classes (centroids included) to `path` as JSON."""
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.to_json(), f, indent=2)
            f.write("\n")

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> WorkloadClasses:
        """Read classes written by `save`."""
        with open(path, encoding="utf-8") as f:
            return cls.from_json(json.load(f))


def features(input_tokens: npt.ArrayLike, output_tokens: npt.ArrayLike) -> FloatArray:
    """The (n, 2) feature matrix: log1p of input and output token counts."""
    inp = np.asarray(input_tokens, dtype=np.float64).reshape(-1)
    out = np.asarray(output_tokens, dtype=np.float64).reshape(-1)
    if inp.shape != out.shape:
        raise ValueError(f"{inp.size} input counts but {out.size} output counts")
    if (inp < 0).any() or (out < 0).any():
        raise ValueError("token counts must be non-negative")
    return np.stack([np.log1p(inp), np.log1p(out)], axis=1)


def fit_classes(
    requests: Sequence[traces.Request], k: int | None = None, seed: int = 0
) -> WorkloadClasses:
    """Fit k-means classes to `requests`; k=None chooses k by silhouette (module docstring)."""
    if not requests:
        raise ValueError("cannot fit workload classes to no requests")
    x = features([r.input_tokens for r in requests], [r.output_tokens for r in requests])
    distinct = len(np.unique(x, axis=0))
    silhouettes: tuple[tuple[int, float], ...] = ()
    if k is None:
        criterion = "silhouette"
        k, silhouettes = choose_k(x, seed)
    else:
        criterion = "given"
        if not 1 <= k <= distinct:
            raise ValueError(f"k={k} must be between 1 and the {distinct} distinct requests")
    labels, log_centres = _kmeans(x, k, seed)
    order = np.lexsort((log_centres[:, 1], log_centres[:, 0]))
    relabel = np.empty(k, dtype=np.int64)
    relabel[order] = np.arange(k)
    labels = relabel[labels]
    log_centres = log_centres[order]
    tokens = np.expm1(x)
    means = [tokens[labels == c].mean(axis=0) for c in range(k)]
    counts = np.bincount(labels, minlength=k)
    return WorkloadClasses(
        centroids=tuple(Centroid(float(a), float(b)) for a, b in np.expm1(log_centres)),
        log_centroids=tuple(Centroid(float(a), float(b)) for a, b in log_centres),
        mean_tokens=tuple(Centroid(float(m[0]), float(m[1])) for m in means),
        shares=tuple(float(n) / len(requests) for n in counts),
        seed=seed,
        criterion=criterion,
        silhouettes=silhouettes,
    )


def choose_k(x: FloatArray, seed: int = 0) -> tuple[int, tuple[tuple[int, float], ...]]:
    """The silhouette criterion (module docstring) on a seeded subsample; returns (k, scores)."""
    rng = np.random.default_rng(seed)
    sample = x if len(x) <= SUBSAMPLE else x[rng.choice(len(x), SUBSAMPLE, replace=False)]
    distinct = len(np.unique(sample, axis=0))
    candidates = [k for k in K_CANDIDATES if k <= distinct - 1]
    if not candidates:
        return 1, ()  # two or fewer distinct shapes: silhouette undefined, one class
    scores: list[tuple[int, float]] = []
    for k in candidates:
        labels, _ = _kmeans(sample, k, seed)
        if len(np.unique(labels)) < 2:
            continue
        scores.append((k, float(silhouette_score(sample, labels))))
    if not scores:
        return 1, ()
    best = max(score for _, score in scores)
    chosen = min(k for k, score in scores if score >= best - SILHOUETTE_TOLERANCE)
    return chosen, tuple(scores)


def class_rates(
    requests: Sequence[traces.Request],
    classes: WorkloadClasses,
    duration_s: float | None = None,
) -> tuple[float, ...]:
    """Mean arrival rate (req/s) of each class over the trace.

    `duration_s` defaults to the trace's span (last minus first timestamp); requests are
    typed with `classes.classify_many` (any `cls` already on them is ignored).
    """
    if not requests:
        return tuple(0.0 for _ in range(classes.k))
    if duration_s is None:
        stamps = [r.timestamp for r in requests]
        duration_s = max(stamps) - min(stamps)
    if duration_s <= 0:
        raise ValueError("trace lasts no time; pass duration_s to compute rates")
    labels = classes.classify_many(
        [r.input_tokens for r in requests], [r.output_tokens for r in requests]
    )
    counts = np.bincount(labels, minlength=classes.k)
    return tuple(float(n) / duration_s for n in counts)


def label(requests: Sequence[traces.Request], classes: WorkloadClasses) -> list[traces.Request]:
    """Copies of `requests` with `cls` set by `classes` (for writing a typed JSONL trace)."""
    labels = classes.classify_many(
        [r.input_tokens for r in requests], [r.output_tokens for r in requests]
    )
    return [dataclasses.replace(r, cls=int(c)) for r, c in zip(requests, labels, strict=True)]


def _kmeans(x: FloatArray, k: int, seed: int) -> tuple[IntArray, FloatArray]:
    model = KMeans(n_clusters=k, n_init=N_INIT, random_state=seed).fit(x)
    labels = np.asarray(model.labels_, dtype=np.int64)
    centres = np.asarray(model.cluster_centers_, dtype=np.float64)
    return labels, centres
