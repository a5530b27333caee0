"""Every axis beyond data parallelism in one table: what each run measured beside its closed form.

The runs are made elsewhere (`train.run` with `tp`, `pp`, `cp` or `ep`); this module only reads
their reports, so the table shows exactly the figures those runs measured (tensor storages, the
ledger's records of every send) and the closed forms each report already holds
(`theory.tensor_parallel`, `theory.pipeline`, `theory.context`, `theory.experts`). A row's figure
is one rank's (rank 0, the first pipeline stage, which holds the most activations); `every_rank`
says whether every rank of that run matched all of its closed forms, and `trains` whether the
run's losses equal one process's.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class AxisCheck:
    axis: str  # "tp", "tp + sp", "pp", "cp", "ep"
    run: str  # the run, in words: "fsdp2 over dp 2, tp 2"
    quantity: str  # what is compared, and whose
    predicted: float
    measured: float
    every_rank: bool  # every rank of the run matched every closed form its report holds
    trains: bool  # losses (and parameters where compared) equal one process's

    @property
    def match(self) -> bool:
        return self.measured == self.predicted


def _tp_rows(rep, axis: str) -> list[AxisCheck]:
    r0 = rep.ranks[0]
    label = f"{rep.strategy}, dp {rep.world_size // rep.tp} x tp {rep.tp}{' + sp' if rep.sequence_parallel else ''}, {rep.model}"
    ok, trains = rep.match.all(), rep.match.losses
    return [AxisCheck(axis, label, "bytes rank 0 sends on tp per step", sum(r0.predicted.comm_by_axis.get("tp", {}).values()),
                      sum(r0.measured.comm_by_axis.get("tp", {}).values()), ok, trains),
            AxisCheck(axis, label, "activation bytes, rank 0", r0.predicted.activations, r0.measured.activations, ok, trains),
            AxisCheck(axis, label, "model-state bytes, rank 0", r0.predicted.total, r0.measured.total, ok, trains)]


def _pp_rows(rep) -> list[AxisCheck]:
    r0 = rep.ranks[0]  # stage 0, which holds the most micro-batches at once
    label = f"{rep.schedule}, p {rep.pp}, m {rep.micro_batches}, {rep.model}"
    ok, trains = rep.match.all(), rep.match.losses
    return [AxisCheck("pp", label, "peak activation bytes, stage 0", r0.predicted.activations,
                      r0.measured.activations, ok, trains),
            AxisCheck("pp", label, "bytes stage 0 sends on pp per step", sum(r0.predicted.comm_by_axis.get("pp", {}).values()),
                      sum(r0.measured.comm_by_axis.get("pp", {}).values()), ok, trains)]


def _cp_rows(rep) -> list[AxisCheck]:
    r0 = rep.ranks[0]
    label = f"{'zig-zag' if rep.zigzag else 'plain'}, cp {rep.cp} x dp {rep.n // rep.cp}, {rep.model}"
    # every rank's figures and its ring's work equal their closed forms
    ok = rep.match.all() and all(r.ring.score_elements == r.ring.predicted_score_elements for r in rep.ranks)
    worst = max(rep.ranks, key=lambda r: r.ring.score_elements)
    return [AxisCheck("cp", label, "ring bytes rank 0 sends per step, forward + backward",
                      sum(r0.predicted.comm_by_axis.get("cp", {}).values()),
                      sum(r0.measured.comm_by_axis.get("cp", {}).values()), ok, rep.match.losses),
            AxisCheck("cp", label, "activation bytes, rank 0", r0.predicted.activations, r0.measured.activations, ok,
                      rep.match.losses),
            AxisCheck("cp", label, f"score elements, the busiest rank ({worst.rank})", worst.ring.predicted_score_elements,
                      worst.ring.score_elements, ok, rep.match.losses)]


def _ep_rows(rep) -> list[AxisCheck]:
    r0 = rep.ranks[0]
    label = f"{rep.strategy}, dp {rep.n // rep.ep} x ep {rep.ep}, {rep.model}"
    ok, trains = rep.match.all(), rep.match.losses
    return [AxisCheck("ep", label, "all-to-all bytes rank 0 sends per step (its router's rows)",
                      sum(r0.predicted.comm_by_axis.get("ep", {}).values()),
                      sum(r0.measured.comm_by_axis.get("ep", {}).values()), ok, trains),
            AxisCheck("ep", label, "activation bytes, rank 0", r0.predicted.activations, r0.measured.activations,
                      ok, trains),
            AxisCheck("ep", label, "model-state bytes, rank 0 (its experts)", r0.predicted.total, r0.measured.total,
                      ok, trains)]


def summary(*, tp: Any = None, sp: Any = None, pp: Any = None, cp: Any = None, ep: Any = None) -> list[AxisCheck]:
    """The rows for the runs given, each a `RunReport`: `tp` and `sp` a strategy with `tp`, without
    and with sequence parallelism; `pp`, `cp` and `ep` runs with those axes."""
    rows: list[AxisCheck] = []
    if tp is not None:
        rows += _tp_rows(tp, "tp")
    if sp is not None:
        rows += _tp_rows(sp, "tp + sp")
    if pp is not None:
        rows += _pp_rows(pp)
    if cp is not None:
        rows += _cp_rows(cp)
    if ep is not None:
        rows += _ep_rows(ep)
    return rows


def table_text(rows: list[AxisCheck]) -> str:
    out = [f"{'axis':7s} {'run':34s} {'what':52s} {'predicted':>11} {'measured':>11}  match  all ranks  trains"]
    for r in rows:
        out.append(f"{r.axis:7s} {r.run:34s} {r.quantity:52s} {float(r.predicted):>11,.0f} {float(r.measured):>11,.0f}  "
                   f"{str(r.match):5s}  {str(r.every_rank):9s}  {r.trains}")
    return "\n".join(out)


__all__ = ["AxisCheck", "summary", "table_text"]
