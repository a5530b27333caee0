"""The time lessons: runs on an emulated link, each measured step beside its prediction.

A lesson is a list of configurations that differ in one knob (DDP's bucket size, FSDP's
prefetch, flat vs hybrid sharding). Each runs with `train.run(..., predict=True)`: a
calibration on links that cost nothing, then the run on the lesson's link; `TimedRun` keeps,
for the slowest rank, the median step after the first measured on its timeline, the step the
schedule predicts (`theory.schedule.predict`), the best any overlap could do (`bound`) and the
exposed communication, measured and predicted, with the peak memory.

Times vary with the machine: a notebook shows its live runs beside the committed ones
(`results`, written by `benchmarks/bench_lessons.py` into `benchmarks/results/lessons.json`)
and asserts only on the committed ones, against the prediction (`check_prediction`).
"""
from __future__ import annotations

import json
import os
import statistics
from dataclasses import asdict, dataclass

from ..references.bench import RESULTS_DIR
from ..runtime import analysis
from ..runtime.links import BETWEEN_DOMAINS
from ..reports import RunReport
from .. import train
from ..train import RunConfig


def viz_bytes(b: int) -> str:
    return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"

# The lessons: (label, x, RunConfig keywords). Flat strategies on the `domain` preset, where
# gpt-small's communication at N = 2 is about its compute; the hybrid lesson on `two-domains`
# (the outer axis 9x slower) and on `domain` (every axis alike).
LESSONS: dict[str, list[tuple[str, float | None, dict]]] = {
    # 02: bucketed DDP, the bucket size swept from one gradient per bucket to one bucket; 8
    # sequences per rank, so that backward lasts about as long as the all-reduce of the gradients
    "ddp_buckets": [
        (f"{viz_bytes(b)} buckets" if b < 16 << 20 else "one bucket", b,
         {"strategy": "ddp_bucketed", "world_size": 2, "links": "domain", "global_batch": 16,
          "options": {"bucket_bytes": b}})
        for b in (1 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20)
    ],
    # 07: FSDP2's prefetch, reshard_after_forward and the asynchronous reduce-scatter
    "fsdp_prefetch": [
        (label, None, {"strategy": "fsdp2", "world_size": 2, "links": "domain", "global_batch": 16, "options": o})
        for label, o in (("no prefetch", {"forward_prefetch": False, "backward_prefetch": False}),
                         ("prefetch", {"forward_prefetch": True, "backward_prefetch": True}),
                         ("prefetch, no reshard", {"forward_prefetch": True, "backward_prefetch": True,
                                                   "reshard_after_forward": False}),
                         # torch's default: a unit's reduce-scatter in flight during the next unit's backward
                         ("prefetch, async reduce-scatter", {"forward_prefetch": True, "backward_prefetch": True,
                                                             "async_reduce_scatter": True}))
    ],
    # 07: the communication-bound threshold: FSDP2's step against the tokens each rank computes
    # (x), 1 to 16 sequences of 128 tokens per rank, the bytes per step the same, prefetch on
    "fsdp_tokens": [
        (f"{b // 2 * 128} tokens", b // 2 * 128,
         {"strategy": "fsdp2", "world_size": 2, "links": "domain", "global_batch": b,
          "options": {"forward_prefetch": True, "backward_prefetch": True}})
        for b in (2, 4, 8, 16, 32)
    ],
    # 10: flat ZeRO-3 over 4 ranks against HSDP and HFSDP over 2 x 2, with the link between the
    # domains 9x slower (a flat ring crosses it), then with every link alike
    "hybrid": [
        ("flat, slow outer", None, {"strategy": "fsdp2", "world_size": 4, "links": str(BETWEEN_DOMAINS)}),
        ("hsdp, slow outer", None, {"strategy": "hsdp", "world_size": 4, "m": 2, "links": "two-domains"}),
        ("hfsdp, slow outer", None, {"strategy": "hfsdp", "world_size": 4, "m": 2, "links": "two-domains"}),
        ("flat, one domain", None, {"strategy": "fsdp2", "world_size": 4, "links": "domain"}),
        ("hsdp, one domain", None, {"strategy": "hsdp", "world_size": 4, "m": 2, "links": "domain"}),
    ],
    # 11: FSDP2 on 1, 2 and 4 ranks, the same global batch (8 sequences) split among them
    "scaling": [(f"N = {n}", n, {"strategy": "fsdp2", "world_size": n, "links": "domain"}) for n in (1, 2, 4)],
}


# The fewest configurations of each lesson that still show its effect, for a quick look on a slow
# or busy machine (`run_lesson(..., quick=True)`): the ends of a sweep and a point where the
# effect turns, or the knob off and on. The committed results always hold every configuration.
# A quick run's steps: a warm-up and one measured step (each configuration runs twice, its
# calibration and itself, so every step more costs two runs' worth).
QUICK_STEPS = 2
QUICK: dict[str, tuple[str, ...]] = {
    "ddp_buckets": ("1 KiB buckets", "1 MiB buckets", "one bucket"),  # alpha-bound, balanced, no overlap
    "fsdp_prefetch": ("no prefetch", "prefetch"),
    "fsdp_tokens": ("128 tokens", "512 tokens"),  # on the communication-bound side, then past it
    "hybrid": ("flat, slow outer", "hsdp, slow outer"),
    "scaling": ("N = 1", "N = 2"),
}


@dataclass(frozen=True)
class TimedRun:
    """One configuration's step time (seconds; the slowest rank's medians after the first step)."""
    label: str
    x: float | None
    measured: float
    predicted: float
    bound: float
    exposed: float
    predicted_exposed: float
    peak: int  # bytes, the largest rank's peak
    # What a derivation of the step needs, read from the slowest rank (None in results written
    # before they were kept): its median backward pass (measured, from its timeline's marks), the
    # gradient collectives it issued per step, and how long the prediction keeps its busiest
    # link busy per step (each collective the link's ring time or, when longer, what the
    # calibration measured it took this machine).
    backward: float | None = None
    collectives: int | None = None
    link_busy: float | None = None

    @property
    def error(self) -> float:
        """predicted / measured - 1."""
        return self.predicted / self.measured - 1

    def plain(self) -> dict:
        return asdict(self)


def timed(label: str, report: RunReport, x: float | None = None) -> TimedRun:
    """A predicted run (`run(..., predict=True)`) as a TimedRun."""
    slow = max(report.ranks, key=lambda r: r.time.median().seconds)
    pred = max(report.ranks, key=lambda r: r.time.predicted_median().seconds)
    m, p = slow.time.median(), pred.time.predicted_median()
    after_first = [s for s in range(report.steps) if s > 0] or [0]
    backward = statistics.median(e - b for s in after_first for b, e in analysis.backward_windows(slow.timeline, s))
    collectives = len(analysis.grad_comm(slow.timeline, after_first[0]))
    return TimedRun(label, x, m.seconds, p.seconds, p.bound, m.exposed, p.exposed, max(r.peak for r in report.ranks),
                    backward=backward, collectives=collectives, link_busy=max(p.comm.values(), default=0.0))


def run_lesson(name: str, *, steps: int = 4, model: str = "gpt-small", pool=None, progress=print,
               quick: bool = False) -> list[TimedRun]:
    """Every configuration of lesson `name`, run on real ranks with a prediction (on `pool` when
    given: a lesson whose configurations share their number of ranks). `quick`: only the
    configurations in `QUICK[name]`, each for at most `QUICK_STEPS` steps (the first is a
    warm-up; the median is of those after it)."""
    out = []
    if quick:
        steps = min(steps, QUICK_STEPS)
    for label, x, kw in LESSONS[name]:
        if quick and label not in QUICK[name]:
            continue
        # through the module, so a wrapper of `train.run` (the notebook suite's shared runs) sees the call
        rep = train.run(RunConfig(steps=steps, model=model, timeline="minimal", **kw), pool=pool, predict=True)
        out.append(timed(label, rep, x))
        if progress is not None:
            r = out[-1]
            progress(f"{name}: {label}: measured {1e3 * r.measured:.0f} ms, predicted {1e3 * r.predicted:.0f} ms")
    return out


def median_of(rounds: list[list[TimedRun]]) -> list[TimedRun]:
    """Several rounds of one lesson merged: per configuration, the median of each figure."""
    out = []
    for same in zip(*rounds):
        if len({r.label for r in same}) != 1:
            raise ValueError("rounds of different lessons")
        med = {f: statistics.median(getattr(r, f) for r in same)
               for f in ("measured", "predicted", "bound", "exposed", "predicted_exposed")}
        med.update({f: (None if any(getattr(r, f) is None for r in same) else statistics.median(getattr(r, f) for r in same))
                    for f in ("backward", "link_busy")})
        counts = {r.collectives for r in same}
        out.append(TimedRun(same[0].label, same[0].x, peak=max(r.peak for r in same),
                            collectives=counts.pop() if len(counts) == 1 else None, **med))
    return out


def results(name: str, path: str | None = None) -> list[TimedRun]:
    """Lesson `name` as committed in benchmarks/results/lessons.json."""
    with open(path or os.path.join(RESULTS_DIR, "lessons.json")) as f:
        data = json.load(f)
    return [TimedRun(**r) for r in data["lessons"][name]]


@dataclass(frozen=True)
class BubbleRow:
    """One pipeline shape's bubble as `benchmarks/bench_pipeline.py` measured it: each stage's idle
    fraction of the step (its timeline, on an emulated device) beside (p-1)/(m+p-1)."""
    p: int
    schedule: str
    m: int
    predicted: float
    measured: list[float]
    compute: list[float]  # the emulated device's t_f, t_b (seconds)

    @property
    def mean(self) -> float:
        return sum(self.measured) / len(self.measured)

    @property
    def worst(self) -> float:
        """The stage furthest from the closed form, relative."""
        return max((abs(b / self.predicted - 1) for b in self.measured), default=0.0)


def pipeline_results(path: str | None = None) -> list[BubbleRow]:
    """The bubble rows committed in benchmarks/results/pipeline.json."""
    with open(path or os.path.join(RESULTS_DIR, "pipeline.json")) as f:
        data = json.load(f)
    return [BubbleRow(**r) for r in data["bubble"]]


def check_prediction(rows: list[TimedRun], tolerance: float) -> None:
    """Every row's prediction within `tolerance` (relative) of its measurement."""
    off = [f"{r.label}: predicted {1e3 * r.predicted:.0f} ms, measured {1e3 * r.measured:.0f} ms" for r in rows
           if abs(r.error) > tolerance]
    if off:
        raise AssertionError(f"prediction off by more than {tolerance:.0%}: " + "; ".join(off))


def table(rows: list[TimedRun]) -> str:
    """The rows as text: step time measured, predicted and the bound; exposed communication
    measured and predicted (ms); the peak memory (MB)."""
    w = max(len(r.label) for r in rows) + 2
    lines = [f"{'':{w}s}{'step time, ms':^30s}{'exposed comm, ms':^20s}",
             f"{'':{w}s}{'measured':>10s}{'predicted':>11s}{'bound':>9s}{'measured':>10s}{'predicted':>10s}{'peak MB':>9s}"]
    for r in rows:
        lines.append(f"{r.label:{w}s}{1e3 * r.measured:>10.0f}{1e3 * r.predicted:>11.0f}{1e3 * r.bound:>9.0f}"
                     f"{1e3 * r.exposed:>10.0f}{1e3 * r.predicted_exposed:>10.0f}{r.peak / 1e6:>9.1f}")
    return "\n".join(lines)


def figure(committed: list[TimedRun], live: list[TimedRun] | None = None, title: str = "",
           memory: bool = False):
    """Step time per configuration: the committed measurement and prediction, the overlap bound,
    and a live run's measurement when given. Configurations with a numeric `x` (a bucket size)
    are drawn against it on a log axis; others side by side. `memory`: the other half of the
    trade beside it, each configuration's peak memory (the largest rank's), and the time axis
    zoomed to the measured spread (its lower end marked), where the differences are a fraction
    of the step."""
    from .viz.common import new_figure, outside_legend

    fig = new_figure(9.5 if memory else 7.5, 3.2)
    if memory:
        ax, mem = fig.subplots(1, 2, width_ratios=[3, 2.4])
    else:
        ax = fig.add_subplot()
    ms = lambda rows, f: [1e3 * getattr(r, f) for r in rows]  # noqa: E731
    numeric = all(r.x is not None for r in committed)
    xs = [r.x for r in committed] if numeric else list(range(len(committed)))
    # a sweep (bucket sizes, ranks) is drawn as lines; separate configurations as points only
    line = (lambda style: style) if numeric else (lambda style: "")  # noqa: E731
    ax.plot(xs, ms(committed, "measured"), "o" + line("-"), color="#4C72B0", label="measured (committed)")
    ax.plot(xs, ms(committed, "predicted"), "s" + line("--"), color="#DD8452", label="predicted (schedule replayed)")
    ax.plot(xs, ms(committed, "bound"), line(":") or "_", ms=18, color="#555555", label="bound: best any overlap reaches")
    if live:  # a quick run has some of the configurations: each drawn at its own place
        at = dict(zip((r.label for r in committed), xs))
        mine = [r for r in live if r.label in at]
        ax.plot([at[r.label] for r in mine], ms(mine, "measured"), "o", mfc="none", color="#C44E52",
                label="measured (this run)")
    if numeric:
        ax.set_xscale("log", base=2)
    else:
        ax.set_xlim(-0.5, len(xs) - 0.5)
    labels = [r.label.replace(" buckets", "").replace(" tokens", "") for r in committed]
    if not numeric:  # side by side: "flat, slow outer" on two lines, so neighbours do not overlap
        labels = [lab.replace(", ", ",\n") for lab in labels]
    ax.set_xticks(xs, labels, fontsize=8)
    if numeric and all(r.label.startswith("N = ") for r in committed):
        ax.set_xlabel("ranks")
    if numeric and all(r.label.endswith(" tokens") for r in committed):
        ax.set_xlabel("tokens per rank per step")
    ax.minorticks_off()
    drawn = ms(committed, "measured") + ms(committed, "predicted") + (ms(live, "measured") if live else [])
    if memory:  # zoomed: the spread between the knobs is what the lesson reads
        lo, hi = min(drawn + ms(committed, "bound")), max(drawn)
        pad = 0.15 * (hi - lo) or 0.05 * hi
        ax.set_ylim(max(0.0, lo - pad), hi + pad)
        ax.set_ylabel(f"step time, ms (axis from {max(0.0, lo - pad):.0f})")
    else:
        ax.set_ylim(0, 1.15 * max(drawn))
        ax.set_ylabel("step time, ms (median after the first)")
    if title:
        ax.set_title(title, fontsize=9)
    if memory:
        peaks = [r.peak / 1e6 for r in committed]
        mem.bar(range(len(committed)), peaks, color="#937860", gid="peak memory")
        mem.set_xticks(range(len(committed)), [lab.replace(" ", "\n") for lab in labels], fontsize=7)
        mem.set_ylim(0, 1.15 * max(peaks))
        mem.set_ylabel("peak memory, MB (largest rank)")
        mem.set_title("what it holds", fontsize=9)
        for i, p in enumerate(peaks):
            mem.annotate(f"{p:.1f}", (i, p), ha="center", va="bottom", fontsize=7)
        ax.legend(fontsize=7, frameon=False, loc="upper left", bbox_to_anchor=(0.0, -0.32), ncol=2)
        return fig
    outside_legend(ax)
    return fig


def mark_knee(fig, psi: float, flops: float, comm_seconds: float, t_star: float):
    """The two regimes of a step-time-against-tokens figure drawn as lines: the compute alone,
    6Ψ FLOPs per token at `flops` per second (a line through 0), and the communication alone
    (`comm_seconds`, flat). The step can be no faster than either; they cross at T* (`t_star`),
    where the knee is, marked. Returns the figure."""
    from .viz.common import outside_legend

    ax = fig.axes[0]
    lo, hi = ax.get_xlim()
    xs = [lo * (hi / lo) ** (k / 64) for k in range(65)] if ax.get_xscale() == "log" else \
        [lo + (hi - lo) * k / 64 for k in range(65)]
    ax.plot(xs, [1e3 * 6 * psi * x / flops for x in xs], color="#2CA02C", lw=1,
            label="compute alone: 6Ψ·tokens / F")
    ax.axhline(1e3 * comm_seconds, color="#8172B3", lw=1, label="communication alone")
    ax.axvline(t_star, color="k", lw=0.8, ls="--")
    ax.plot([t_star], [1e3 * comm_seconds], "D", color="k", ms=5, label=f"T* = {t_star:.0f} tokens: they cross")
    ax.set_xlim(lo, hi)
    outside_legend(ax)
    return fig


def gaps(lesson: str, label: str, *, steps: int = 4, model: str = "gpt-small", pool=None):
    """Why one configuration of `lesson` misses its bound: a calibration run (links that cost
    nothing), the slowest rank's median step after the first replayed on the lesson's link
    (`theory.schedule.replay`, as `run(..., predict=True)` does), and that simulated step's
    pauses (`theory.schedule.gaps`). Returns (result, bound, gaps)."""
    from dataclasses import replace

    from ..theory import schedule
    from ..train import resolve

    kw = next(k for lab, _, k in LESSONS[lesson] if lab == label)
    cfg = resolve(RunConfig(steps=steps, model=model, timeline="minimal", **kw))
    cal = train.run(replace(cfg, links=cfg.links.instant()), pool=pool)
    best = None
    for r in cal.ranks:
        axes = {c.axis for c in r.timeline.comm}
        on = {a: schedule.Link(x.alpha, x.beta) for a in axes if (x := cfg.links.for_axis(a)) is not None}
        sims = []
        for st in r.time.steps[1:] or r.time.steps:
            prog = schedule.replay(r.timeline.comm, st.step, st.start, st.start + st.seconds, transport=True)
            sims.append((schedule.simulate(prog, on), schedule.bound(prog, on), on))
        sims.sort(key=lambda s: s[0].seconds)
        median = sims[(len(sims) - 1) // 2]
        if best is None or median[0].seconds > best[0].seconds:
            best = median
    result, bound, on = best
    return result, bound, [g for a in sorted(on) for g in schedule.gaps(result, a)]


def gap_table(result, bound: float, found) -> str:
    """The pauses of a simulated step, summed by what they waited for: the compute stream's
    waits by collective (the unit's all-gathers, its reduce-scatters) and the link's idle time
    by the collective it waited to carry."""
    import re

    def what(name: str) -> str:  # "all_gather 7 (fsdp2/unit4/params)" -> "all_gather, params"
        m = re.match(r"(\w+) \d+ \((.*)\)", name)
        return f"{m.group(1)} ({m.group(2).split('/')[-1]})" if m else name

    sums: dict[tuple[str, str], list[float]] = {}
    for g in found:
        sums.setdefault((g.kind, what(g.on)), []).append(g.end - g.start)
    lines = [f"step {1e3 * result.seconds:.0f} ms (simulated), bound {1e3 * bound:.0f} ms, "
             f"compute {1e3 * result.compute:.0f} ms"]
    for (kind, on), ts in sorted(sums.items(), key=lambda kv: -sum(kv[1])):
        verb = "compute waits for" if kind == "wait" else "link idle before"
        lines.append(f"  {verb:18s} {on:32s} {1e3 * sum(ts):6.1f} ms in {len(ts):2d} pauses")
    return "\n".join(lines)
