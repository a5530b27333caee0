"""The 5-D planner under sliders (`theory.planner`): GPUs, GPUs per node, HBM, global batch and the
assumed share of peak, with optimizer offload and FP8 as switches; the plans that fit, ranked, with why each of the top three beats the next;
and the design exercise (70B on 256 GPUs) graded as the learner types a plan."""
from __future__ import annotations

import html

import ipywidgets as W

from ...theory import planner
from .common import message


class PlannerWidget:
    """Controls over `planner.plan`; `update()` re-ranks, `grade()` checks the design answer."""

    def __init__(self, gpus: int = 256, per_node: int = 8, hbm_gb: int = 80, global_batch: int = 1024,
                 efficiency: float = 0.5, top: int = 5):
        style = {"description_width": "140px"}
        lay = W.Layout(width="380px")
        self.top = top
        self.gpus = W.SelectionSlider(options=[16, 32, 64, 128, 256, 512, 1024, 2048], value=gpus,
                                      description="GPUs", style=style, layout=lay)
        self.per_node = W.SelectionSlider(options=[4, 8], value=per_node, description="GPUs per node",
                                          style=style, layout=lay)
        self.hbm = W.SelectionSlider(options=[40, 80, 141], value=hbm_gb, description="HBM per GPU (GB)",
                                     style=style, layout=lay)
        self.batch = W.SelectionSlider(options=[256, 512, 1024, 2048], value=global_batch,
                                       description="global batch (seqs)", style=style, layout=lay)
        self.efficiency = W.FloatSlider(value=efficiency, min=0.2, max=0.8, step=0.05, readout_format=".2f",
                                        description="share of peak", style=style, layout=lay)
        self.offload = W.Checkbox(value=False, description="also with optimizer offload", indent=False)
        self.fp8 = W.Checkbox(value=False, description="linear layers in FP8", indent=False)
        self.message, self.table, self.why = W.HTML(), W.HTML(), W.HTML()
        self.answer = W.Text(placeholder="dp 8, tp 8, pp 4, ZeRO-1", description="your 70B plan",
                             continuous_update=False, style=style, layout=W.Layout(width="520px"))
        self.check = W.Button(description="Check")
        self.verdict = W.HTML()
        self.report: planner.PlanReport | None = None
        self.graded: planner.DesignGrade | None = None
        for w in (self.gpus, self.per_node, self.hbm, self.batch, self.efficiency, self.offload, self.fp8):
            w.observe(lambda _c: self.update(), names="value")
        self.check.on_click(lambda _b: self.grade())
        self.answer.observe(lambda _c: self.grade(), names="value")  # graded on Enter (or leaving the box)
        self.widget = W.VBox([W.HBox([W.VBox([self.gpus, self.per_node, self.hbm]), W.VBox([self.batch, self.efficiency]),
                                     W.VBox([self.offload, self.fp8])]),
                              self.message, self.table, self.why,
                              W.HTML(f"<b>Design exercise</b>: Llama-2-70B on {planner.DESIGN_GPUS} GPUs (8 per node, "
                                     f"80 GB), global batch {planner.DESIGN_BATCH} sequences: choose dp, tp, pp and "
                                     "the ZeRO level."),
                              W.HBox([self.answer, self.check]), self.verdict])
        self.update()

    def _repr_mimebundle_(self, **kw):
        return self.widget._repr_mimebundle_(**kw)

    def cluster(self) -> planner.Cluster:
        return planner.Cluster(self.gpus.value, self.per_node.value, self.hbm.value * 1e9,
                               efficiency=self.efficiency.value)

    def update(self) -> None:
        self.report = planner.plan(planner.LLAMA2_70B, self.cluster(), self.batch.value,
                                   offload=(False, True) if self.offload.value else (False,), fp8=(self.fp8.value,))
        rep = self.report
        message(self.message, f"{len(rep.ranked)} plans fit, {rep.too_big} exist but do not fit, "
                              f"{sum(rep.refused.values())} cannot exist", ok=bool(rep.ranked))
        head = ["#", "dp", "tp", "pp", "cp", "ZeRO", "b", "v", "recompute", "memory GB", "step s", "bubble ms", "tp ms",
                "cp ms", "dp ms", "pp ms", "offload ms"]
        rows = []
        for i, e in enumerate(rep.ranked[:self.top]):
            t = e.terms()
            zero = f"{e.plan.zero} + offload" if e.plan.offload else e.plan.zero
            rows.append([i + 1, e.plan.dp, e.plan.tp, e.plan.pp, e.plan.cp, zero, e.plan.micro_batch, e.plan.v,
                         e.plan.recompute, f"{e.memory / 1e9:.1f}",
                         f"{e.step:.2f}", f"{1e3 * t['bubble']:.0f}", f"{1e3 * t['tp']:.0f}", f"{1e3 * t['cp']:.0f}",
                         f"{1e3 * t['dp']:.0f}", f"{1e3 * t['pp']:.0f}", f"{1e3 * t['offload']:.0f}"])
        self.table.value = ("<table><thead><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr></thead><tbody>"
                            + "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
                            + "</tbody></table>")
        lines = [f"#{i + 1} {html.escape(str(rep.ranked[i].plan))}: "
                 f"{html.escape(planner.why_better(rep.ranked[i], rep.ranked[i + 1]))}"
                 for i in range(min(3, len(rep.ranked) - 1))]
        self.why.value = "<br>".join(lines)

    def grade(self) -> planner.DesignGrade:
        self.graded = planner.grade_design(self.answer.value)
        g = self.graded
        items = "".join(f"<li>{'✓' if c.held else '✗'} <b>{html.escape(c.name)}</b>: {html.escape(c.detail)}</li>"
                        for c in g.conditions)
        head = "a good plan" if g.ok else "not yet: " + ", ".join(c.name for c in g.broken())
        self.verdict.value = f"<div>{html.escape(head)}</div><ul>{items}</ul>"
        return g


def planner_widget(**kw) -> PlannerWidget:
    """GPUs, node size, HBM, batch, efficiency, offload and FP8 over `theory.planner`, and the design exercise."""
    return PlannerWidget(**kw)
