"""Pipeline parallelism in closed form: the schedules, the bubble, each stage's activations and the
bytes that cross each stage boundary (`strategies.pipeline` runs what these count).

p stages, m micro-batches per optimizer step, stage s in 0 .. p-1.

Schedule (what stage s does, in order; F i = forward of micro-batch i, B i = its backward):

    GPipe (Huang et al. 2019, §2.2)   F 0 .. F m-1, then B 0 .. B m-1 (backward in the order
                                      of the forwards, as torch's ScheduleGPipe runs it)
    1F1B  (Narayanan et al. 2021,     warm-up: w = min(p-1-s, m) forwards; steady state: one
           §2.2, PipeDream-Flush)     forward then one backward, m-w times; cool-down: the w
                                      backwards left. Stage s holds at most min(p-s, m) micro-
                                      batches' activations, the first stage p, whatever m is.

Bubble: with each stage's forward and backward of one micro-batch taking t_f and t_b, a step takes
(m + p - 1)(t_f + t_b) and each stage computes for m(t_f + t_b), idle for the rest:

    bubble fraction = (p - 1) / (m + p - 1)          (GPipe and 1F1B alike; 1F1B saves memory)

Activations (Korthikanti et al. 2022, §4.2.3): one micro-batch's saved tensors on stage s are its
layers' (`theory.activations.gpt_activation_terms`: the embedding's on the first stage, L/p
blocks', the head's and the loss's on the last), times the micro-batches in flight at once:
m under GPipe, min(p - s, m) under 1F1B.

Bytes per optimizer step on the pp axis: every micro-batch's activation b·s·h crosses each
boundary forward and its gradient backward, point to point (`send`):

    stage s sends  m · b·s·h·a  (s < p-1, activations)  +  m · b·s·h·a  (s > 0, gradients)
    each boundary carries 2 · m · b·s·h·a per step
"""
from __future__ import annotations

from fractions import Fraction

GPIPE, ONE_F_ONE_B = "gpipe", "1f1b"
SCHEDULES = (GPIPE, ONE_F_ONE_B)
FORWARD, BACKWARD = "F", "B"


def _check(p: int, m: int, stage: int | None = None) -> None:
    if not (isinstance(p, int) and isinstance(m, int) and p >= 1 and m >= 1):
        raise ValueError(f"stages and micro-batches must be integers >= 1, got p = {p!r}, m = {m!r}")
    if stage is not None and not 0 <= stage < p:
        raise ValueError(f"stage {stage} is not one of the {p} stages")


def schedule(kind: str, p: int, m: int, stage: int) -> list[tuple[str, int]]:
    """Stage `stage`'s actions in order: ("F", i) and ("B", i) for micro-batches i = 0 .. m-1."""
    _check(p, m, stage)
    if kind == GPIPE:
        return [(FORWARD, i) for i in range(m)] + [(BACKWARD, i) for i in range(m)]
    if kind != ONE_F_ONE_B:
        raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, got {kind!r}")
    warm = min(p - 1 - stage, m)
    out = [(FORWARD, i) for i in range(warm)]
    for i in range(m - warm):
        out += [(FORWARD, warm + i), (BACKWARD, i)]
    out += [(BACKWARD, i) for i in range(m - warm, m)]
    return out


def in_flight(kind: str, p: int, m: int, stage: int) -> int:
    """The most micro-batches whose activations stage `stage` holds at once (from `schedule`)."""
    live = most = 0
    for what, _ in schedule(kind, p, m, stage):
        live += 1 if what == FORWARD else -1
        most = max(most, live)
    return most


def bubble_fraction(p: int, m: int) -> Fraction:
    """The share of a step each stage is idle, (p-1)/(m+p-1), with equal stages."""
    _check(p, m)
    return Fraction(p - 1, m + p - 1)


def timed_schedule(kind: str, p: int, m: int, t_f, t_b) -> list[list[tuple[str, int, object, object]]]:
    """When each action runs, per stage, with every forward lasting t_f and every backward t_b and
    nothing else taking time: ("F" or "B", micro-batch, start, end). Each stage runs its
    `schedule` in order; an action starts when the stage is free and its input exists (F i on
    stage s after F i on s-1; B i on s after B i on s+1). The picture the measured timeline is set
    against; its span is (m + p - 1)(t_f + t_b) for both schedules."""
    _check(p, m)
    orders = [schedule(kind, p, m, s) for s in range(p)]
    done: dict[tuple[int, str, int], object] = {}
    out: list[list] = [[] for _ in range(p)]
    free = [0] * p
    nxt = [0] * p
    while any(nxt[s] < len(orders[s]) for s in range(p)):
        moved = False
        for s in range(p):
            if nxt[s] == len(orders[s]):
                continue
            what, i = orders[s][nxt[s]]
            need = (s - 1, FORWARD, i) if what == FORWARD else (s + 1, BACKWARD, i)
            if not 0 <= need[0] < p:
                need = None
            if need is not None and need not in done:
                continue
            start = max(free[s], done[need]) if need is not None else free[s]
            end = start + (t_f if what == FORWARD else t_b)
            done[s, what, i] = free[s] = end
            out[s].append((what, i, start, end))
            nxt[s] += 1
            moved = True
        if not moved:  # cannot happen for the two schedules (tests/test_pipeline.py simulates both)
            raise RuntimeError(f"{kind} with p = {p}, m = {m} waits on itself")
    return out


def stage_layers(n_layers: int, p: int, stage: int) -> range:
    """The blocks stage `stage` runs: L/p contiguous ones (L must divide by p)."""
    _check(p, 1, stage)
    if n_layers % p:
        raise ValueError(f"{n_layers} layers do not split into {p} equal stages")
    k = n_layers // p
    return range(stage * k, (stage + 1) * k)


def stage_activation_bytes(cfg_like, batch: int, dtype_bytes: int, p: int, stage: int,
                           ln_stats_bytes: int | None = None) -> int:
    """What autograd saves on stage `stage` for one micro-batch of `batch` sequences: its blocks'
    terms, the embedding's on the first stage, the head's and the loss's on the last."""
    from .activations import gpt_activation_terms

    terms = gpt_activation_terms(cfg_like, batch, cfg_like.seq_len, dtype_bytes, ln_stats_bytes=ln_stats_bytes)
    n = len(stage_layers(cfg_like.n_layers, p, stage))
    per = {u: sum(t.bytes for t in terms if t.unit == u) for u in ("embed", "block", "head")}
    return n * per["block"] + (per["embed"] if stage == 0 else 0) + (per["head"] if stage == p - 1 else 0)


def peak_activation_bytes(kind: str, cfg_like, batch: int, dtype_bytes: int, p: int, m: int, stage: int,
                          ln_stats_bytes: int | None = None) -> int:
    """Stage `stage`'s most activation bytes at once: micro-batches in flight x one's."""
    return in_flight(kind, p, m, stage) * stage_activation_bytes(cfg_like, batch, dtype_bytes, p, stage,
                                                                  ln_stats_bytes)


def boundary_bytes(batch: int, seq: int, hidden: int, dtype_bytes: int) -> int:
    """One micro-batch's activation (or its gradient) crossing a stage boundary: b·s·h·a."""
    return batch * seq * hidden * dtype_bytes


def stage_sent_bytes(batch: int, seq: int, hidden: int, dtype_bytes: int, p: int, m: int, stage: int) -> int:
    """Bytes stage `stage` sends on the pp axis per step: m activations forward unless it is the
    last stage, m gradients backward unless it is the first."""
    _check(p, m, stage)
    one = boundary_bytes(batch, seq, hidden, dtype_bytes)
    return m * one * ((stage < p - 1) + (stage > 0))
