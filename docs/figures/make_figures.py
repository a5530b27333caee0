"""Re-draw the README's figures: the 200-step loss curves of every strategy family against
single-process training (from `benchmarks/results/loss_curves.json`, which
`benchmarks/bench_loss_curves.py` regenerates); from real runs, FSDP1 on gpt-small over 4 ranks
(gloo on CPU), one optimizer step, one tooth per unit as it is gathered and freed; and FSDP2 on 2
ranks over the emulated `domain` link, its Chrome trace drawn for the last step.

    .venv/bin/python docs/figures/make_figures.py
"""
import json
import os
from pathlib import Path

from zeroedu.notebook import trace, viz
from zeroedu.references.bench import RESULTS_DIR
from zeroedu.train import RunConfig, run

HERE = Path(__file__).resolve().parent


def loss_curves() -> None:
    with open(os.path.join(RESULTS_DIR, "loss_curves.json")) as f:
        fig = viz.learning_curves(json.load(f))
    out = HERE / "loss_curves.png"
    fig.savefig(out, dpi=110, bbox_inches="tight")
    print(f"wrote {out}")


def sawtooth() -> None:
    # one sequence per rank, so that the activations do not dwarf the teeth; rank 0 only, since
    # every rank of FSDP1 holds the same bytes (its flat chunks are all the same size)
    report = run(RunConfig("fsdp1", 4, steps=2, model="gpt-small", global_batch=4))
    assert all(v is not False for v in report.match.plain().values()), report.match
    totals = {tuple(sum(e["bytes"].values()) for e in r.timeline.events if e["step"] == 1) for r in report.ranks}
    assert len(totals) == 1, "the ranks differ: draw a panel per rank"
    fig = viz.memory_timeline(report, ranks=[0], layout="panels", x="event", steps=1)
    out = HERE / "fsdp_sawtooth.png"
    fig.savefig(out, dpi=110, bbox_inches="tight")
    print(f"wrote {out}")


def fsdp2_trace() -> None:
    report = run(RunConfig("fsdp2", 2, steps=3, model="gpt-small", links="domain", timeline="minimal"))
    fig = viz.trace_figure(trace.trace(report))
    out = HERE / "fsdp2_trace.png"
    fig.savefig(out, dpi=110, bbox_inches="tight")
    print(f"wrote {out}")


def main() -> None:
    loss_curves()
    sawtooth()
    fsdp2_trace()


if __name__ == "__main__":
    main()
