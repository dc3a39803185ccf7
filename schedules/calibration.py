"""The calibrated cost model: a plan's time on a fabric, with terms fitted to that fabric's measurements.

The α-β model (``schedules.cost``) prices a schedule's links and nothing else, so at small sizes it predicts times
no GPU reaches (0.3 µs for an all-reduce that takes 3 µs on H200s: a kernel launch and a flag round trip cost
more). A plan's time on a fabric whose plans were measured is priced instead as

    launch_us + warps_us · warps + hop_us[protocol] · hops + arrival_us[protocol] · (arrivals - hops)
      + source_us[protocol] · (sources - arrivals)
      + (1 + misaligned_slowdown · misaligned)
        · max(links_us / efficiency[protocol],
              threadblock_us_per_byte[protocol] · (1024 / threads)^threads_power[protocol] · threadblock bytes,
              memory_us_per_byte · GPU bytes)

- ``launch_us`` and ``warps_us``: the launch, and what each warp of the plan's thread blocks adds to it;
- ``hops``: the waits on the longest thread block (``wait`` ops and packet reads), each a round trip between GPUs,
  priced per protocol (an LL packet carries its own flag, a Lamport packet is its own flag; a Simple transfer
  waits for a signal);
- ``arrivals``: the waits of the longest thread block, one per op that waits (for a peer's signal or packets, or
  another block's semaphore); waits after the first of a hop wait for what is already on its way (a multi-peer
  block's packets from 3 peers, read one peer after another), each costing ``arrival_us`` rather than a round
  trip;
- ``sources``: what those waits wait for, each peer's packets or signal and each semaphore: a one-shot reduction
  on 4 GPUs reads 3 peers' packets in one op, each source after the first of an op costing ``source_us``;
- ``links_us``: the α-β model's transfer time without its latencies (the busiest link of each step), at a
  fraction ``efficiency`` of the links' bandwidth (LL packets carry half);
- threadblock bytes: what the busiest thread block reads and writes (an LL packet twice), at a rate that grows
  with its threads: a plan of few thread blocks cannot feed the links;
- GPU bytes: what all of a GPU's thread blocks read and write, at the GPU memory's rate;
- ``misaligned``: 1 where the message does not cut into the plan's ``chunks`` at 16-byte boundaries (a 64 MB
  all-reduce in 96 chunks), so that thread blocks cannot move their slices in 16-byte vector loads and stores.

``fit`` finds the terms from measured (plan, size, µs) points by least squares on log times (scipy's
Levenberg-Marquardt over log terms, so every term stays positive), each point weighted by how close it comes to
the fastest plan measured at its size (the plans selection chooses between); ``Calibration.residuals`` reports how
far predictions stay from the measurements. A fabric has a calibration only where it was measured
(``load_calibration`` gives None elsewhere); weft says so next to any prediction made without one.

>>> f = PlanFeatures("LL", instances=1, threads=1024, threadblocks=1, hops=1, arrivals=1, sources=1, chunks=1,
...                  bytes_us_per_byte=1e-6,
...                  threadblock_bytes_per_byte=2.0, gpu_bytes_per_byte=2.0)
>>> c = Calibration("topo-0000000000000000", "pair", dict(DEFAULTS), ())
>>> round(c.predict_us(f, 1 << 20), 2) > round(c.predict_us(f, 1 << 10), 2) > c.terms["launch_us"]
True
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from weftcore.errors import WeftError

FORMAT = "weft.calibration/1"
PROTOCOLS = ("LL", "Simple", "Lamport")
# The terms and where a fit starts from (µs, or factors); every term is positive.
DEFAULTS = {
    "launch_us": 2.0,
    "warps_us": 0.001,
    "memory_us_per_byte": 1e-6,
    "misaligned_slowdown": 0.5,
    "hop_us.LL": 1.0,
    "hop_us.Simple": 2.0,
    "arrival_us.LL": 0.3,
    "arrival_us.Simple": 0.3,
    "source_us.LL": 0.1,
    "source_us.Simple": 0.1,
    "efficiency.LL": 0.4,
    "efficiency.Simple": 0.8,
    "threadblock_us_per_byte.LL": 1e-4,
    "threadblock_us_per_byte.Simple": 1e-4,
    "threads_power.LL": 0.5,
    "threads_power.Simple": 0.5,
    "hop_us.Lamport": 1.0,
    "arrival_us.Lamport": 0.3,
    "source_us.Lamport": 0.1,
    "efficiency.Lamport": 0.8,
    "threadblock_us_per_byte.Lamport": 1e-4,
    "threads_power.Lamport": 0.5,
}
CEILINGS = {f"efficiency.{p}": 1.0 for p in PROTOCOLS}
CALIBRATIONS = Path(__file__).parent / "calibrations"
TOLERANCE = 1.5  # the factor between prediction and measurement that a calibration is held to
ALIGNMENT = 16  # bytes: a thread block's vector loads and stores
STARTS = 48  # the fit's starting points


class CalibrationError(WeftError):
    """A calibration file or fit that cannot be used."""


@dataclass(frozen=True)
class PlanFeatures:
    """What the calibrated model reads from a plan and its schedule on a topology."""

    protocol: str
    instances: int  # for the reader: the model prices the thread blocks and the bytes each moves
    threads: int
    threadblocks: int
    hops: int
    arrivals: int  # the ops of its longest thread block that wait (for signals, packets, semaphores): >= hops
    sources: int  # the peers' packets and signals (and semaphores) those ops wait for: >= arrivals
    chunks: int  # the chunks a message is cut into (its slices are aligned where size / chunks is a multiple of 16)
    bytes_us_per_byte: float  # the α-β transfer time per message byte, latencies left out
    threadblock_bytes_per_byte: float  # bytes the busiest thread block reads and writes per message byte
    gpu_bytes_per_byte: float  # bytes the busiest GPU's thread blocks read and write per message byte

    def to_json(self) -> dict[str, Any]:
        return {
            "protocol": self.protocol,
            "instances": self.instances,
            "threads": self.threads,
            "threadblocks": self.threadblocks,
            "hops": self.hops,
            "arrivals": self.arrivals,
            "sources": self.sources,
            "chunks": self.chunks,
            "bytes_us_per_byte": self.bytes_us_per_byte,
            "threadblock_bytes_per_byte": self.threadblock_bytes_per_byte,
            "gpu_bytes_per_byte": self.gpu_bytes_per_byte,
        }

    @staticmethod
    def from_json(doc: dict[str, Any], source: str) -> PlanFeatures:
        try:
            f = PlanFeatures(
                str(doc["protocol"]),
                int(doc["instances"]),
                int(doc["threads"]),
                int(doc["threadblocks"]),
                int(doc["hops"]),
                int(doc["arrivals"]),
                int(doc["sources"]),
                int(doc["chunks"]),
                float(doc["bytes_us_per_byte"]),
                float(doc["threadblock_bytes_per_byte"]),
                float(doc["gpu_bytes_per_byte"]),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise CalibrationError(f"{source}: features: missing or malformed ({e})") from None
        if (
            f.protocol not in PROTOCOLS
            or min(f.instances, f.threads) < 1
            or not f.hops <= f.arrivals <= f.sources
            or f.chunks < 1
            or min(f.bytes_us_per_byte, f.threadblock_bytes_per_byte) < 0
        ):
            raise CalibrationError(f"{source}: features: {doc!r} are not a plan's")
        return f


@dataclass(frozen=True)
class Observation:
    """One measured time: a plan (by name, with its features) at one size."""

    plan: str
    collective: str
    features: PlanFeatures
    nbytes: int
    measured_us: float

    def to_json(self) -> dict[str, Any]:
        return {
            "plan": self.plan,
            "collective": self.collective,
            "features": self.features.to_json(),
            "nbytes": self.nbytes,
            "measured_us": self.measured_us,
        }


def _model(terms: dict[str, float], f: PlanFeatures, nbytes: float) -> float:
    columns = _columns([Observation("", "", f, 0, 1.0)]) | {"nbytes": np.array([float(nbytes)])}
    return float(_model_columns(terms, columns)[0])


@dataclass(frozen=True)
class Calibration:
    """The fitted terms of one fabric (a topology fingerprint) and the measurements they were fitted to."""

    topology: str
    topology_name: str
    terms: dict[str, float]
    observations: tuple[Observation, ...]
    sources: tuple[str, ...] = ()

    def predict_us(self, features: PlanFeatures, nbytes: float) -> float:
        return _model(self.terms, features, nbytes)

    @property
    def protocols(self) -> frozenset[str]:
        """The protocols whose terms were fitted: those of its measured plans (the others keep the defaults, and a
        plan of theirs is not priced by this calibration)."""
        return frozenset(o.features.protocol for o in self.observations)

    def ratios(self) -> list[float]:
        """predicted / measured for every observation."""
        if not self.observations:
            return []
        predicted = _model_columns(self.terms, _columns(list(self.observations)))
        ratios: list[float] = (predicted / np.array([o.measured_us for o in self.observations])).tolist()
        return ratios

    def residuals(self) -> dict[str, float]:
        """The fit's residuals: the worst ratio either way, the spread of log ratios, and how many points lie
        within ``TOLERANCE``."""
        ratios = np.array(self.ratios())
        worst = float(np.max(np.maximum(ratios, 1 / ratios))) if len(ratios) else 1.0
        logs = np.log(ratios) if len(ratios) else np.zeros(1)
        return {
            "points": int(len(ratios)),
            "worst_ratio": worst,
            "rms_log_ratio": float(np.sqrt(np.mean(logs**2))),
            "within_tolerance": int(np.sum((ratios <= TOLERANCE) & (ratios >= 1 / TOLERANCE))),
            "tolerance": TOLERANCE,
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "topology": self.topology,
            "topology_name": self.topology_name,
            "terms": dict(sorted(self.terms.items())),
            "residuals": self.residuals(),
            "sources": list(self.sources),
            "observations": [o.to_json() for o in self.observations],
        }

    @staticmethod
    def from_json(doc: object, source: str) -> Calibration:
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise CalibrationError(f"{source}: format: must be {FORMAT!r}")
        terms = doc.get("terms")
        if (
            not isinstance(terms, dict)
            or set(terms) != set(DEFAULTS)
            or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < math.inf for v in terms.values()
            )
        ):
            raise CalibrationError(f"{source}: terms: must give each of {', '.join(DEFAULTS)} as a positive number")
        observations = []
        for i, o in enumerate(doc.get("observations") or []):
            where = f"{source}: observations[{i}]"
            if (
                not isinstance(o, dict)
                or not isinstance(o.get("nbytes"), int)
                or not isinstance(o.get("measured_us"), (int, float))
                or o["measured_us"] <= 0
            ):
                raise CalibrationError(f"{where}: must hold nbytes and a positive measured_us")
            observations.append(
                Observation(
                    str(o.get("plan")),
                    str(o.get("collective")),
                    PlanFeatures.from_json(o.get("features") or {}, where),
                    o["nbytes"],
                    float(o["measured_us"]),
                )
            )
        return Calibration(
            str(doc.get("topology")),
            str(doc.get("topology_name")),
            {k: float(v) for k, v in terms.items()},
            tuple(observations),
            tuple(str(s) for s in doc.get("sources") or ()),
        )


def fit(
    topology: str,
    topology_name: str,
    observations: list[Observation],
    sources: tuple[str, ...] = (),
    iterations: int = 200,
) -> Calibration:
    """The terms that best fit ``observations`` (least squares on log times: scipy's Levenberg-Marquardt over log
    terms, ``iterations`` Jacobians at most per start)."""
    from scipy.optimize import least_squares  # only fitting needs scipy: pricing a plan stays light

    if len(observations) < len(DEFAULTS):
        raise CalibrationError(
            f"calibration of {topology_name}: {len(observations)} measurements cannot fit {len(DEFAULTS)} terms"
        )
    names = list(DEFAULTS)
    used = {k for o in observations for k in names if k.endswith(f".{o.features.protocol}")} | {
        "launch_us",
        "warps_us",
        "memory_us_per_byte",
        "misaligned_slowdown",
    }
    free = [k for k in names if k in used]
    columns = _columns(observations)
    measured = np.log([o.measured_us for o in observations])
    weights = np.sqrt(_selection_weights(observations))

    def terms_at(x: np.ndarray) -> dict[str, float]:
        # each term within e^±10 of its default (far beyond any fabric, and no overflow on the way there), and a
        # link's efficiency at most 1
        return dict(DEFAULTS) | {
            k: float(
                np.exp(
                    np.clip(
                        v,
                        math.log(DEFAULTS[k]) - 10,
                        math.log(CEILINGS[k]) if k in CEILINGS else math.log(DEFAULTS[k]) + 10,
                    )
                )
            )
            for k, v in zip(free, x, strict=True)
        }

    def residual(x: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore"):  # a trial point far from the defaults may overflow a product; quietly
            weighted: np.ndarray = weights * (np.log(_model_columns(terms_at(x), columns)) - measured)
        return weighted

    # The model's max() of three rates leaves terms without a gradient where no point is limited by them at the
    # start, so the fit starts from several points (the defaults, then a fixed seed's spread around them).
    start, spread = np.log([DEFAULTS[k] for k in free]), np.random.default_rng(0)
    best = None
    for k in range(STARTS):
        x = least_squares(
            residual,
            start + (spread.uniform(-2, 2, len(start)) if k else 0),
            method="lm",
            max_nfev=iterations * (len(start) + 1),
        ).x
        cost = float(residual(x) @ residual(x))
        if best is None or cost < best[0]:
            best = (cost, x)
    assert best is not None  # STARTS >= 1 fits were tried
    x = best[1]
    terms = terms_at(x)
    return Calibration(topology, topology_name, terms, tuple(observations), sources)


def _selection_weights(observations: list[Observation]) -> np.ndarray:
    """Each point's weight in the fit: the fastest measured time of its collective and size over its own. The
    model's predictions choose among plans, so its error matters most on the plans a choice is between; a plan 3×
    slower than the best at its size still counts, a third as much."""
    fastest: dict[tuple[str, int], float] = {}
    for o in observations:
        key = (o.collective, o.nbytes)
        fastest[key] = min(fastest.get(key, math.inf), o.measured_us)
    return np.array([fastest[(o.collective, o.nbytes)] / o.measured_us for o in observations])


def _columns(observations: list[Observation]) -> dict[str, np.ndarray]:
    """The observations' features and sizes as arrays, for the model over all of them at once."""
    fs = [o.features for o in observations]
    return {
        "protocol": np.array([PROTOCOLS.index(f.protocol) for f in fs]),
        "nbytes": np.array([float(o.nbytes) for o in observations]),
        **{
            name: np.array([float(getattr(f, name)) for f in fs])
            for name in (
                "threads",
                "threadblocks",
                "hops",
                "arrivals",
                "sources",
                "chunks",
                "bytes_us_per_byte",
                "threadblock_bytes_per_byte",
                "gpu_bytes_per_byte",
            )
        },
    }


def _model_columns(terms: dict[str, float], c: dict[str, np.ndarray]) -> np.ndarray:
    """``_model`` over arrays of features (``_columns``)."""

    def per(name: str) -> np.ndarray:
        return np.choose(c["protocol"], [terms[f"{name}.{p}"] for p in PROTOCOLS])

    links = c["bytes_us_per_byte"] * c["nbytes"] / per("efficiency")
    feed = (
        c["threadblock_bytes_per_byte"]
        * c["nbytes"]
        * per("threadblock_us_per_byte")
        * (1024 / c["threads"]) ** per("threads_power")
    )
    memory = c["gpu_bytes_per_byte"] * c["nbytes"] * terms["memory_us_per_byte"]
    times: np.ndarray = (
        terms["launch_us"]
        + terms["warps_us"] * c["threadblocks"] * c["threads"] / 32
        + per("hop_us") * c["hops"]
        + per("arrival_us") * (c["arrivals"] - c["hops"])
        + per("source_us") * (c["sources"] - c["arrivals"])
        + (1 + terms["misaligned_slowdown"] * (c["nbytes"] % (c["chunks"] * ALIGNMENT) != 0))
        * np.maximum(np.maximum(links, feed), memory)
    )
    return times


def dumps(calibration: Calibration) -> str:
    """Deterministic, reviewable JSON: the terms and residuals indented, one observation per line."""
    doc = calibration.to_json()
    observations = doc.pop("observations")
    head = json.dumps(doc, indent=2, sort_keys=True)[:-2]
    rows = ",\n".join("    " + json.dumps(o, sort_keys=True) for o in observations)
    return f'{head},\n  "observations": [\n{rows}\n  ]\n}}\n'


def calibration_path(topology_name: str) -> Path:
    """Where weft keeps a fabric's calibration (a file per topology, named after its catalog spec)."""
    safe = "".join(c if c.isalnum() or c in "_-" else "-" for c in topology_name)
    return CALIBRATIONS / f"{safe}.json"


@lru_cache(maxsize=64)  # package data, read once per process: `registry list` asks once per entry
def load_calibration(fingerprint: str, directory: Path = CALIBRATIONS) -> Calibration | None:
    """The calibration of the fabric with this fingerprint, or None where it was never measured."""
    if not directory.is_dir():
        return None
    for path in sorted(directory.glob("*.json")):
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise CalibrationError(f"calibration {path}: cannot read: {e}") from None
        if isinstance(doc, dict) and doc.get("topology") == fingerprint:
            return Calibration.from_json(doc, str(path))
    return None
