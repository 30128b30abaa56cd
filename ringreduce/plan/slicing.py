"""Which route a call above ``min_bytes`` takes: NCCL's flat all-reduce, one slice or the
pipeline, and whether a lossy wire pays. Pure: no torch.

Flat is NCCL's own all-reduce on the whole group: one collective, whichever algorithm
NCCL tunes for the size (its tree sees the M hosts). One slice issues the whole tensor
as three collectives, one after the other: a reduce-scatter inside the machine, an
all-reduce along the rail, an all-gather inside the machine (the two-level
composition); its time is the sum of the three. Two-level issues the same three
collectives alone in their NCCL groups, as torch.distributed's two-level composition
does, and the end-of-call check after them in groups of its own (one slice rides it in
the rail's and the all-gather's groups, which costs a launch less but puts a second
collective beside the data in the same kernel). The pipeline cuts the tensor into
slices and overlaps the stages of different slices, so its time approaches the
slowest stage's, but every slice costs host time (an NCCL group per wave, events per
stage) and a fill and drain. Which is fastest depends on the link, the machines and the
size (pipelining pays where the intra-machine stages take time comparable to the
rail's; NCCL's tree ties the hierarchy on NVLink machines over a slow link), so the
construction probe (execution/probe.py) measures them instead of guessing.

``choose`` decides from what it measured at each probe size (``probe_sizes``): seconds
per call of every pass on every route, the slowest rank's, so all ranks decide alike.
The fastest route wins unless a route with fewer collectives per call (flat, then one
slice, then the pipeline: less host time and CPU, which the probe's device-side clock
does not see) is within ``margin`` of it. A lossy wire (8- or 4-bit: the compressed
route) is taken only where it is faster than the exact route chosen by more than the
margin: where exact is as fast, exact is taken (as fast, and exact). With two probe
sizes, calls below their geometric mean take the small size's route, larger calls the
large size's (``Choice.at``).

The margin is the probe's own noise: for each route, the spread of its passes
(slowest pass over fastest, minus one; every pass times the same calls), the largest
over the routes compared, clamped to [``MIN_MARGIN``, ``MAX_MARGIN``]. A difference
within what repeating one measurement shows is not evidence that one route is faster.
The floor: with ``PROBE_PASSES`` passes the spread under-reads the noise. The ceiling:
the goal (never below 0.97x the fastest reference) bounds what a cheaper route may cost.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

FLAT = "flat"
ONE_SLICE = "one-slice"
TWO_LEVEL = "two-level"
PIPELINED = "pipelined"
PLANS = (ONE_SLICE, TWO_LEVEL, PIPELINED)
"""Config.plan's values (config.py names them too: it sits below this package)."""
UNSLICED = (ONE_SLICE, TWO_LEVEL)
"""The plans that issue a call as three collectives on one stream (one_slice.py)."""
ROUTES = (FLAT, ONE_SLICE, TWO_LEVEL, PIPELINED)
"""What the probe may choose for exact calls, cheapest on the host first (ties go to
the first)."""
WIRE = "wire"
"""The probe's name for the communicator's lossy wire (the compressed route)."""

MIN_MARGIN = 0.01
"""The smallest margin (see the module's docstring)."""
MAX_MARGIN = 0.03
"""The largest margin: a cheaper route is never taken when measured more than 3% slower."""

PROBE_BYTES = 16 << 20
"""The probe's large call: large enough that bandwidth, not latency, decides (a DDP
bucket is 25 MiB), small enough that the probe takes well under a second at 10 Gbit/s.
Its shape is here, not in execution/probe.py, so the model (ringreduce/model/) can
price the probe without torch."""
SMALL_PROBE_BYTES = 4 << 20
"""The probe's small call: where latency and host time start to decide (the pipeline's
fill and drain, a slice's host cost) and the best route can differ from 16 MiB's."""
LARGEST_PROBE_BYTES = 256 << 20
"""Above this ``min_bytes`` the probe is not run (the pipeline is taken)."""
PROBE_WARMUP = 2
"""Untimed calls per route and size right before its first timed pass: the first goes
through the Python issuer (connections, kernels loading), the second is traced by the
native issuer; only replays are timed."""
PROBE_REWARM = 1
"""Untimed calls per route and size right before each later pass: its connections idled
while the other routes were timed, and a call that wakes them is not one training makes."""
PROBE_ROUNDS = 4
"""Timed calls per route, size and pass: queued back to back asynchronously, each on a
tensor of its own, then waited for together, as DDP issues its buckets (calls on one
tensor would wait for each other); a pass's time per call is its window over them. So a
route that wins one call alone but loses when calls queue behind each other (the
pipeline's streams shared by the next call's slices) is timed as training runs it."""
PROBE_PASSES = 2
"""The routes are timed in turn, this many passes each, and each route's fastest pass
counts, so that none pays alone for what warms up or disturbs the link while the probe
runs; the passes' spread sets the margin."""


@dataclass(frozen=True)
class Choice:
    """The route hierarchical calls of a communicator take, and why: ``plan`` for exact
    calls (FLAT, ONE_SLICE or PIPELINED), ``wire`` whether calls the communicator's
    8- or 4-bit wire carries take it; calls under ``split_bytes`` take ``below``'s."""

    plan: str
    reason: str
    wire: bool = True
    below: Choice | None = None
    split_bytes: int = 0

    @property
    def one_slice(self) -> bool:
        return self.plan == ONE_SLICE

    @property
    def two_level(self) -> bool:
        return self.plan == TWO_LEVEL

    @property
    def unsliced(self) -> bool:
        """One slice or two-level: three collectives on one stream (one_slice.py)."""
        return self.plan in UNSLICED

    @property
    def flat(self) -> bool:
        return self.plan == FLAT

    def at(self, nbytes: int) -> Choice:
        """The choice for a call of ``nbytes``."""
        if self.below is not None and nbytes < self.split_bytes:
            return self.below
        return self

    @functools.cached_property
    def why(self) -> str:
        """One line for flight records and logs (made once: every call records it)."""
        wire = "" if self.wire else ", wire=exact"
        return f"plan={self.plan}{wire}: {self.reason}"

    @functools.cached_property
    def summary(self) -> str:
        """Every size's choice, for describe()."""
        if self.below is None:
            return self.why
        return f"below {_mib(self.split_bytes)}: {self.below.why}; from " \
               f"{_mib(self.split_bytes)}: {self.why}"


@dataclass(frozen=True)
class Timing:
    """What the probe measured at one size: each route's seconds per call, one value
    per pass (the slowest rank's)."""

    nbytes: int
    passes: Mapping[str, Sequence[float]]


def margin(timing: Timing, least: float = MIN_MARGIN) -> float:
    """The probe's noise at this size: the largest relative spread of a route's passes,
    clamped to [``least``, MAX_MARGIN]."""
    spread = max(max(p) / min(p) - 1 for p in timing.passes.values())
    return min(MAX_MARGIN, max(least, spread))


def choose_at(timing: Timing, least_margin: float = MIN_MARGIN) -> Choice:
    """The route at one probe size: the cheapest exact route within the margin of the
    fastest; the wire where it beats that route by more than the margin. The model
    (ringreduce/model/probe.py), whose times have no spread, passes its own
    ``least_margin``."""
    _check(timing)
    best = {route: min(p) for route, p in timing.passes.items()}
    m = margin(timing, least_margin)
    exact = [r for r in ROUTES if r in best]
    fastest = min(exact, key=lambda r: best[r])
    plan = next(r for r in exact if best[r] <= best[fastest] * (1 + m))
    others = sorted((best[r], r) for r in exact if r != plan)
    times = ", ".join(f"{r} {best[r] * 1e3:.2f} ms" for r in (*exact, *_wire(best)))
    said = f"probe at {_mib(timing.nbytes)} (slowest rank, best of {_passes(timing)}): " \
           f"{times}; margin {m:.1%} (the passes' spread)"
    if plan == fastest:
        verdict = f"{plan} is the fastest" + (
            f", by {others[0][0] / best[plan] - 1:.1%} over {others[0][1]}" if others else "")
    else:
        verdict = (f"{plan} is within the margin of {fastest} ({best[plan] / best[fastest] - 1:.1%}"
                   " slower) and issues fewer collectives")
    if WIRE not in best:
        return Choice(plan, f"{said}: {verdict}")
    wire = best[WIRE] * (1 + m) < best[plan]
    verdict += (f"; the wire is faster than {plan} by {best[plan] / best[WIRE] - 1:.1%}" if wire
                else f"; exact {plan} is as fast as the wire or faster "
                     f"({best[WIRE] / best[plan] - 1:+.1%} on the wire): exact taken")
    return Choice(plan, f"{said}: {verdict}", wire)


def choose(timings: Sequence[Timing], least_margin: float = MIN_MARGIN) -> Choice:
    """The choice from the probe's timings at one or two sizes: with two, calls below
    their geometric mean take the smaller size's route (the probe knows nothing in
    between; the midpoint on a log scale splits the doubt evenly)."""
    if len(timings) not in (1, 2):
        raise ValueError(f"the probe times one or two sizes, got {len(timings)}")
    ordered = sorted(timings, key=lambda t: t.nbytes)
    chosen = choose_at(ordered[-1], least_margin)
    if len(ordered) == 1:
        return chosen
    small, large = ordered
    split = math.isqrt(small.nbytes * large.nbytes)
    return dataclasses.replace(chosen, below=choose_at(small, least_margin), split_bytes=split)


def _check(timing: Timing) -> None:
    if not any(r in timing.passes for r in ROUTES):
        raise ValueError(f"the probe timed no exact route ({ROUTES}): {dict(timing.passes)!r}")
    for route, passes in timing.passes.items():
        if route not in (*ROUTES, WIRE):
            raise ValueError(f"route {route!r} is not one of {(*ROUTES, WIRE)}")
        if not passes or min(passes) <= 0 or not all(map(math.isfinite, passes)):
            raise ValueError(f"probe times must be positive and finite, got {route}: "
                             f"{list(passes)!r}")


def _wire(best: Mapping[str, float]) -> tuple[str, ...]:
    return (WIRE,) if WIRE in best else ()


def _passes(timing: Timing) -> str:
    n = max(len(p) for p in timing.passes.values())
    return f"{n} pass{'es' if n != 1 else ''}"


def _mib(nbytes: int) -> str:
    return f"{nbytes / (1 << 20):g} MiB"


def probe_sizes(min_bytes: int) -> tuple[int, ...]:
    """The probe's calls: ``SMALL_PROBE_BYTES`` and ``PROBE_BYTES``, each raised to
    ``min_bytes`` (smaller calls take the flat route, which the probe would not time);
    one size when both are."""
    return tuple(sorted({max(SMALL_PROBE_BYTES, min_bytes), max(PROBE_BYTES, min_bytes)}))


def probe_routes(lossy: bool) -> tuple[str, ...]:
    """What the probe times: every exact route, and the wire where the communicator has
    an 8- or 4-bit one (``lossy``; a 16-bit wire's float32 calls keep the pipeline)."""
    return (*ROUTES, WIRE) if lossy else ROUTES


def probe_calls(min_bytes: int, lossy: bool) -> int:
    """How many calls the probe makes (numbered before the user's)."""
    return len(probe_sizes(min_bytes)) * len(probe_routes(lossy)) * probe_calls_per_route()


def probe_calls_per_route() -> int:
    """One route's calls at one size: its warm-up before each pass and its timed ones."""
    return PROBE_WARMUP + (PROBE_PASSES - 1) * PROBE_REWARM + PROBE_PASSES * PROBE_ROUNDS


def probe_bytes(min_bytes: int) -> int:
    """The probe's call: ``PROBE_BYTES``, or ``min_bytes`` where larger (smaller calls take
    the flat route, which the probe would not time)."""
    return max(PROBE_BYTES, min_bytes)


def unprobed(min_bytes: int) -> Choice | None:
    """The pipeline where the probe's call would be above ``LARGEST_PROBE_BYTES``; else None."""
    if probe_bytes(min_bytes) <= LARGEST_PROBE_BYTES:
        return None
    return Choice(PIPELINED, f"min_bytes={min_bytes} is above the probe's largest call "
                             f"({LARGEST_PROBE_BYTES} bytes)")


def given(plan: str) -> Choice:
    """The plan set by the user (Config.plan)."""
    return Choice(plan, "set by plan= (RINGREDUCE_PLAN)")


UNDECIDED = Choice(PIPELINED, "not probed yet (the probe runs at the end of construction)")
ONE_MACHINE = Choice(ONE_SLICE, "one machine: every call takes the flat route")
ONE_DEVICE = Choice(ONE_SLICE, "one device per machine: the rail all-reduce is the whole call")
CPU_DEFAULT = Choice(PIPELINED, "gloo: inside a machine as slow as the network, so the "
                                "stages overlap usefully; plan='one-slice' takes one slice")
