"""The Kairos authors' measured latency profiles, read as their own server reads them.

Kairos (HPDC 2023, ../shared/papers/004_9f86fbc3662264b0.txt) serves recommendation models
on a pool of one base instance type (g4dn.xlarge, a T4 GPU: the only type meeting QoS at
every batch size, §7) and cheaper auxiliary CPU types. The artifact
(../shared/data/kairos, README there) gives, per instance type, model and batch size
10..1000 step 10, 100 measured inference latencies and 100 data-loading latencies. A
query's service time is the two summed sample by sample, the largest sample dropped and
the rest averaged.

Usage::

    prof = Profiles.load("../shared/data/kairos")
    prof.latency_ms("g4dn.xlarge", "rm2", 1000)      # ~260 ms
    prof.coefficient("t3.xlarge", "rm2")               # L_base(1000) / L_t3(1000) <= 1
    sizes = sample_batch_sizes(10_000, np.random.default_rng(0))
"""
from __future__ import annotations

import io
import math
import json
import re
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

#: the base instance type of the paper's search space (§7)
BASE_TYPE = "g4dn.xlarge"
#: p99 QoS targets in ms (Table 3)
QOS_MS = {"ncf": 5.0, "rm2": 350.0, "wnd": 25.0, "mtwnd": 25.0, "dien": 35.0}
#: the batch size at which heterogeneity coefficients are taken (README)
REFERENCE_BATCH = 1000
MAX_BATCH = 1000

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_ROOT = REPO_ROOT.parent / "shared" / "data" / "kairos"

_NAME = re.compile(r"(?:^|/)data/(logs_load/)?([^/]+)/([a-z0-9]+)_(\d+)_1\.json$")


def _trimmed_mean(samples: np.ndarray) -> float:
    """The authors' estimator: drop the largest sample, average the rest."""
    s = np.sort(np.asarray(samples, float))
    return float(s[:-1].mean()) if len(s) > 1 else float(s.mean())


@dataclass
class Profiles:
    """Service times per (instance type, model, measured batch size), in ms.

    Attributes
    ----------
    types, models : list of str
        Instance types (base first) and model names present in the data.
    batches : np.ndarray
        Measured batch sizes (10, 20, ..., 1000).
    service_ms : np.ndarray
        (types, models, batches): inference + data loading, trimmed mean.
    inference_ms : np.ndarray
        Same shape, inference alone (the ``data/<type>`` tree; underestimates).
    prices : dict
        On-demand $/h per instance type (price.csv).
    allocator : dict
        allocator_profile.json as given (to cross-check derivations against).
    space : dict
        instance.json: ``ins_types``, ``max_num``, ``price``, ``cost`` (the budget).
    """

    types: list[str]
    models: list[str]
    batches: np.ndarray
    service_ms: np.ndarray
    inference_ms: np.ndarray
    prices: dict[str, float] = field(default_factory=dict)
    allocator: dict = field(default_factory=dict)
    space: dict = field(default_factory=dict)

    # ------------------------------------------------------------------ loading
    @classmethod
    def load(cls, root: str | Path | None = None) -> "Profiles":
        """Read a profile directory (data.tar.gz + allocator_profile.json + instance.json +
        price.csv); ``root`` defaults to ``../shared/data/kairos`` beside the repository."""
        root = Path(root) if root is not None else DEFAULT_ROOT
        tar_path = root / "data.tar.gz"
        if not tar_path.exists():
            raise FileNotFoundError(f"no Kairos profile at {root} (data.tar.gz missing)")
        # parsed in memory each time: ~0.16 s for the 4000 files, faster than a cache's hash
        types, models, batches, service, inference = _parse_tar(tar_path.read_bytes())
        prices = {}
        if (root / "price.csv").exists():
            for line in (root / "price.csv").read_text().splitlines()[1:]:
                if line.strip():
                    name, price = line.split(",")
                    prices[name.strip()] = float(price)
        allocator = json.loads((root / "allocator_profile.json").read_text()) \
            if (root / "allocator_profile.json").exists() else {}
        space = json.loads((root / "instance.json").read_text()) if (root / "instance.json").exists() else {}
        return cls([str(t) for t in types], [str(m) for m in models], np.asarray(batches),
                   np.asarray(service, float), np.asarray(inference, float), prices, allocator, space)

    # ------------------------------------------------------------------ queries
    def _row(self, table: np.ndarray, type_: str, model: str) -> np.ndarray:
        try:
            return table[self.types.index(type_), self.models.index(model)]
        except ValueError:
            raise KeyError(f"no profile for instance type {type_!r} and model {model!r}") from None

    def latency_ms(self, type_: str, model: str, batch, inference_only: bool = False):
        """Service time of a query of ``batch`` items (scalar or array, 1..1000).

        Linear interpolation between measured sizes; below the smallest measured size
        the time scales proportionally from it (``L(b) = L(10) * b / 10``)."""
        row = self._row(self.inference_ms if inference_only else self.service_ms, type_, model)
        b = np.clip(np.asarray(batch, float), 1, self.batches[-1])
        lo = self.batches[0]
        out = np.where(b < lo, row[0] * b / lo, np.interp(b, self.batches, row))
        return float(out) if np.ndim(out) == 0 else out

    def coefficient(self, type_: str, model: str, base: str = BASE_TYPE) -> float:
        """Heterogeneity coefficient L_base(1000) / L_type(1000) (<= 1; base = 1)."""
        return self.latency_ms(base, model, REFERENCE_BATCH) / self.latency_ms(type_, model, REFERENCE_BATCH)

    def price(self, type_: str) -> float:
        if type_ in self.prices:
            return self.prices[type_]
        sp = self.space
        return float(sp["price"][sp["ins_types"].index(type_)])

    @property
    def search_types(self) -> list[str]:
        """Instance types of the search space, base first (instance.json)."""
        return list(self.space.get("ins_types", self.types))

    @property
    def max_counts(self) -> list[int]:
        return [int(n) for n in self.space.get("max_num", [10] * len(self.search_types))]

    @property
    def budget(self) -> float:
        return float(self.space.get("cost", 2.5))


def _parse_tar(raw: bytes):
    inference: dict[tuple[str, str, int], np.ndarray] = {}
    load: dict[tuple[str, str, int], np.ndarray] = {}
    with tarfile.open(fileobj=io.BytesIO(raw), mode="r:gz") as tar:
        for member in tar:
            m = _NAME.search(member.name)
            if not member.isfile() or not m:
                continue
            samples = np.asarray(json.load(tar.extractfile(member)), float)
            (load if m.group(1) else inference)[(m.group(2), m.group(3), int(m.group(4)))] = samples
    types = sorted({k[0] for k in inference}, key=lambda t: (t != BASE_TYPE, t))
    models = sorted({k[1] for k in inference})
    batches = np.array(sorted({k[2] for k in inference}))
    shape = (len(types), len(models), len(batches))
    service, infer = np.full(shape, np.nan), np.full(shape, np.nan)
    for i, t in enumerate(types):
        for j, mdl in enumerate(models):
            for k, b in enumerate(batches):
                inf = inference.get((t, mdl, b))
                if inf is None:
                    continue
                ld = load.get((t, mdl, b))
                n = len(inf) if ld is None else min(len(inf), len(ld))
                total = inf[:n] + (ld[:n] if ld is not None else 0.0)
                service[i, j, k] = _trimmed_mean(total)
                infer[i, j, k] = _trimmed_mean(inf)
    return types, models, batches, service, infer


# ---------------------------------------------------------------------- batch-size mix
#: The artifact's mix as read here: a log-normal(5.1, 0.2) body (median ~164 items) mixed
#: with two uniform ranges. The paper gives only "a production trace" (§7); the README
#: says "log-normal(5.1, 0.2) mixed with uniform ranges, capped at 1000". The weights and
#: ranges below are fitted (least squares) to the CDF points the artifact itself records
#: as (vio_batch, small_ratio) in allocator_profile.json: 15 points, max error 0.008.
MIX_LOGNORMAL = (0.76, 5.1, 0.2)
MIX_UNIFORM = ((0.115, 335, 596), (0.125, 1, 1000))


def sample_batch_sizes(n: int, rng: np.random.Generator) -> np.ndarray:
    """Draw ``n`` query batch sizes (ints in 1..1000) from the paper's batch-size mix."""
    weights = [MIX_LOGNORMAL[0]] + [u[0] for u in MIX_UNIFORM]
    which = rng.choice(len(weights), size=n, p=np.asarray(weights) / sum(weights))
    out = rng.lognormal(MIX_LOGNORMAL[1], MIX_LOGNORMAL[2], size=n)
    for i, (_, lo, hi) in enumerate(MIX_UNIFORM, start=1):
        pick = which == i
        out[pick] = rng.uniform(lo, hi, size=int(pick.sum()))
    return np.clip(np.rint(out), 1, MAX_BATCH).astype(int)


def batch_size_pmf() -> np.ndarray:
    """Exact probabilities of batch sizes 1..1000 under :func:`sample_batch_sizes` (index
    ``b - 1``), so that planner figures are deterministic rather than sampled."""
    edges = np.arange(0.5, MAX_BATCH + 1.5)          # rint: b gets (b - .5, b + .5]
    w, mu, sigma = MIX_LOGNORMAL
    z = (np.log(edges) - mu) / (sigma * math.sqrt(2.0))
    cdf = w * 0.5 * (1.0 + np.array([math.erf(x) for x in z]))   # no scipy import: plan fast
    for wu, lo, hi in MIX_UNIFORM:
        cdf = cdf + wu * np.clip((edges - lo) / (hi - lo), 0, 1)
    cdf = cdf / (w + sum(u[0] for u in MIX_UNIFORM))
    cdf[0], cdf[-1] = 0.0, 1.0                        # clipping folds the tails into 1 and 1000
    return np.diff(cdf)
