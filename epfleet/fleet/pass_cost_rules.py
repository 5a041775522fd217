"""What a pass of the evidence index costs, as terms fitted from passes measured at a few
fleet sizes, and the hour those terms give a fleet of another size.

Each measure of a pass (GETs, LISTs, PUTs, CPU seconds) is taken to be a fixed part, a
part per device in the fleet (N: what a pass does for every report listed, every record
kept) and a part per new report it folds (R: a report read, attributed and written back),
fitted by least squares to passes measured at two or more N, each with two numbers of
new reports or more (R a different share of N). A term the passes cannot separate (all
of them at one N, or R always the same share of N) is left out and said so; a negative
term, or passes the terms do not fit, is warned about: the extrapolation is then not to
be trusted. Pure: the measured figures come from ``bench/evidence_index.py``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

TERMS = ("fixed", "per device", "per new report")
NEGATIVE_SHARE = 0.02  # a negative term worth more than this share of a measured pass
RESIDUAL_SHARE = 0.20  # terms that miss a measured pass by more than this share of it


@dataclass(frozen=True)
class Measured:
    """One measured pass: the fleet's size, the new reports it folded, its costs."""

    devices: int
    new: int
    costs: Mapping[str, float]
    sizes: Mapping[str, float] | None = None  # what shares are taken of (``fit_terms``)


@dataclass(frozen=True)
class Terms:
    """A measure's fitted terms: ``fixed + per_device * N + per_new * R``."""

    fixed: float
    per_device: float
    per_new: float
    warnings: tuple[str, ...] = ()

    def parts(self, devices: float, new: float) -> tuple[float, float, float]:
        return (self.fixed, self.per_device * devices, self.per_new * new)

    def at(self, devices: float, new: float) -> float:
        return sum(self.parts(devices, new))


def fit_terms(
    points: Sequence[tuple[float, float, float]],
    what: str = "cost",
    sizes: Sequence[float] | None = None,
) -> Terms:
    """The terms of ``(N, R, measured)`` points. The fixed term is always fitted; the
    per-device term when the points have two N or more; the per-new-report term when R
    varies apart from N. ``what`` names the measure in the warnings; ``sizes``, what each
    point's shares are taken of when judging the fit (the point's own figure unless
    given: a difference of two passes is judged against the passes, not itself)."""
    if not points:
        raise ValueError(f"{what}: no measured passes to fit")
    devices = [float(p[0]) for p in points]
    new = [float(p[1]) for p in points]
    measured = [float(p[2]) for p in points]
    columns = {"fixed": [1.0] * len(points)}
    warnings: list[str] = []
    if len(set(devices)) > 1:
        columns["per device"] = devices
    else:
        warnings.append(f"{what}: measured at one N only: no per-device term")
    if any(new):
        if _independent(list(columns.values()), new):
            columns["per new report"] = new
        else:
            warnings.append(
                f"{what}: new reports always the same share of N (or one N): the per-new-"
                "report term is not separable and is counted in the others"
            )
    solution = _least_squares(list(columns.values()), measured)
    assert solution is not None  # the columns kept are independent
    found = dict(zip(columns, solution, strict=True))
    terms = Terms(found["fixed"], found.get("per device", 0.0), found.get("per new report", 0.0))
    doubts = _doubts(terms, points, sizes or [abs(p[2]) for p in points], what)
    return Terms(terms.fixed, terms.per_device, terms.per_new, (*warnings, *doubts))


def _independent(columns: list[list[float]], candidate: list[float]) -> bool:
    """Whether ``candidate`` is not (nearly) a combination of ``columns``."""
    fitted = _least_squares(columns, candidate)
    if fitted is None:
        return False
    rows = range(len(candidate))
    residual = [
        candidate[i] - sum(c[i] * f for c, f in zip(columns, fitted, strict=True)) for i in rows
    ]
    size = max(abs(v) for v in candidate)
    return max(abs(r) for r in residual) > 1e-6 * size


def _least_squares(columns: list[list[float]], values: list[float]) -> list[float] | None:
    """The coefficients of ``columns`` nearest ``values`` (normal equations, each column
    scaled to 1 first), or None when the columns are not independent."""
    scales = [max(abs(v) for v in column) or 1.0 for column in columns]
    scaled = [[v / s for v in column] for column, s in zip(columns, scales, strict=True)]
    k = len(scaled)
    matrix = [
        [sum(a * b for a, b in zip(scaled[i], scaled[j], strict=True)) for j in range(k)]
        + [sum(a * b for a, b in zip(scaled[i], values, strict=True))]
        for i in range(k)
    ]
    for col in range(k):  # Gauss-Jordan with partial pivoting
        pivot = max(range(col, k), key=lambda row: abs(matrix[row][col]))
        if abs(matrix[pivot][col]) < 1e-10 * len(values):
            return None
        matrix[col], matrix[pivot] = matrix[pivot], matrix[col]
        for row in range(k):
            if row != col:
                factor = matrix[row][col] / matrix[col][col]
                matrix[row] = [
                    a - factor * b for a, b in zip(matrix[row], matrix[col], strict=True)
                ]
    return [matrix[i][k] / matrix[i][i] / scales[i] for i in range(k)]


def _doubts(
    terms: Terms, points: Sequence[tuple[float, float, float]], sizes: Sequence[float], what: str
) -> list[str]:
    doubts = []
    largest = max(range(len(points)), key=lambda i: (points[i][0], points[i][1]))
    n, r, cost = points[largest]
    for name, part in zip(TERMS, terms.parts(n, r), strict=True):
        if part < 0 and -part > NEGATIVE_SHARE * sizes[largest]:
            doubts.append(
                f"{what}: negative {name} term ({part:,.3g} at N = {n:,.0f}, R = {r:,.0f}, "
                f"against {cost:,.3g} measured): inconsistent passes"
            )
    for (n, r, cost), size in zip(points, sizes, strict=True):
        fitted = terms.at(n, r)
        if abs(fitted - cost) > RESIDUAL_SHARE * size + 1e-9:
            doubts.append(
                f"{what}: the terms give {fitted:,.3g} at N = {n:,.0f}, R = {r:,.0f}, "
                f"measured {cost:,.3g}: not linear in N and R"
            )
    return doubts


def fit_pass(passes: Sequence[Measured], measures: Sequence[str], what: str) -> dict[str, Terms]:
    """Each of ``measures`` of a kind of pass (``what``) fitted over ``passes``."""
    fits = {}
    for measure in measures:
        points = [(p.devices, p.new, p.costs.get(measure, 0.0)) for p in passes]
        sizes = [
            abs(p.sizes.get(measure, 0.0) if p.sizes is not None else p.costs.get(measure, 0.0))
            for p in passes
        ]
        fits[measure] = fit_terms(points, f"{what}, {measure}", sizes)
    return fits


@dataclass(frozen=True)
class Schedule:
    """An hour of the readers: ``folding`` passes list the inbox and fold the hour's new
    reports between them; ``sharing`` names the kinds of pass that answer from a recent
    pass, and how many of each an hour; one folding pass in ``full_listing_every`` lists
    every device's key as well (``EPFLEET_EVIDENCE_FULL_LISTING_EVERY``)."""

    name: str
    folding: float
    sharing: Mapping[str, float] = field(default_factory=dict)
    full_listing_every: int = 12


FOLDING = "folding pass"
FULL_LISTING = "a full listing, beyond the folding pass"


def hour(
    fits: Mapping[str, Mapping[str, Terms]],
    schedule: Schedule,
    devices: int,
    new: int,
) -> dict[str, dict[str, tuple[float, float, float]]]:
    """What ``schedule``'s hour costs at ``devices`` with ``new`` reports in it, per kind of
    pass and measure, as its (fixed, per-device, per-new-report) parts. ``fits`` holds the
    terms of ``FOLDING``, ``FULL_LISTING`` and each kind ``schedule`` shares."""
    folds = schedule.folding
    listings = folds / schedule.full_listing_every
    counted = [(FOLDING, folds), *schedule.sharing.items(), (FULL_LISTING, listings)]
    spent: dict[str, dict[str, tuple[float, float, float]]] = {}
    for kind, times in counted:
        folded = new if kind == FOLDING else 0
        spent[kind] = {}
        for measure, terms in fits[kind].items():
            fixed, per_device, per_new = terms.parts(devices, folded / folds if folds else 0)
            spent[kind][measure] = (times * fixed, times * per_device, times * per_new)
    return spent


def totals(
    spent: Mapping[str, Mapping[str, tuple[float, float, float]]],
) -> dict[str, tuple[float, float, float]]:
    """``hour``'s parts summed over the kinds of pass, per measure."""
    summed: dict[str, tuple[float, float, float]] = {}
    for by_measure in spent.values():
        for measure, parts in by_measure.items():
            before = summed.get(measure, (0.0, 0.0, 0.0))
            summed[measure] = (before[0] + parts[0], before[1] + parts[1], before[2] + parts[2])
    return summed
