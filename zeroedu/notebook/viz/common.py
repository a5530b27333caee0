"""What every figure shares: one colour per category, a constrained-layout Figure, byte units."""
from __future__ import annotations

from matplotlib.figure import Figure

from ...fmt import byte_scale, human_bytes
from ...kinds import CATEGORIES

COLORS = {
    "param": "#4C72B0", "grad": "#DD8452", "optim": "#55A868",
    "master": "#55A868", "main_grad": "#8C8C8C", "m": "#64B5CD", "v": "#8172B3",
    "gathered": "#C44E52", "comm_buffer": "#937860", "activation": "#DA8BC3", "backward_temp": "#F0C05A",
    "optimizer_temp": "#2CA02C",
    "all_reduce": "#4C72B0", "reduce_scatter": "#DD8452", "all_gather": "#55A868",
    "send": "#8172B3", "recv": "#937860", "broadcast": "#8C8C8C",
}
# One colour per rank (cycled), for figures that colour by owner.
RANK_COLORS = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C")
STATE_CATS = ("param", "grad", "optim")
TIMELINE_CATS = CATEGORIES  # the ledger's categories, in its order (`zeroedu.kinds.Category`)


# What each ledger category holds, in the course's words: a legend says "comm_buffer: unsharded
# gradients, collective buffers" where the text speaks of a unit's unsharded gradient.
CATEGORY_WORDS = {
    "param": "parameters", "grad": "gradients", "master": "fp32 master weights",
    "main_grad": "fp32 gradient accumulators", "m": "Adam's first moment", "v": "Adam's second moment",
    "gathered": "gathered (unsharded) parameters", "comm_buffer": "unsharded gradients, collective buffers",
    "activation": "saved activations", "backward_temp": "backward's temporaries",
    "optimizer_temp": "the update's scratch",
}


def category_label(category: str) -> str:
    """A legend entry for a ledger category: its name, then what it holds."""
    words = CATEGORY_WORDS.get(category)
    return f"{category}: {words}" if words else category


def rank_color(r: int) -> str:
    return RANK_COLORS[r % len(RANK_COLORS)]


def mesh(report) -> str:
    """A run's ranks as the course writes them: "N=4", or "N=2, M=2" on a two-level mesh."""
    return f"N={report.n}" + (f", M={report.m}" if getattr(report, "m", 1) > 1 else "")


def new_figure(w: float = 7.0, h: float = 3.2, **kw) -> Figure:
    return Figure(figsize=(w, h), layout="constrained", **kw)


__all__ = ["CATEGORY_WORDS", "COLORS", "RANK_COLORS", "category_label", "mesh", "rank_color", "STATE_CATS", "TIMELINE_CATS", "new_figure", "byte_scale", "human_bytes"]


def outside_legend(ax, handles=None, ncol: int = 1) -> None:
    """A legend to the right of the axes, so it never hides data."""
    kw = {} if handles is None else {"handles": handles}
    ax.legend(**kw, fontsize=7, frameon=False, loc="upper left", bbox_to_anchor=(1.01, 1.0),
              borderaxespad=0.0, ncol=ncol)
