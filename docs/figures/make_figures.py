"""Re-draw the README's figures from real runs: FSDP1 on gpt-small over 4 ranks (gloo on CPU),
one optimizer step, a panel per rank, one tooth per unit as it is gathered and freed; and FSDP2
on 2 ranks over the emulated `domain` link, its Chrome trace drawn for the last step.

    .venv/bin/python docs/figures/make_figures.py
"""
from pathlib import Path

from zeroedu.notebook import trace, viz
from zeroedu.train import RunConfig, run

HERE = Path(__file__).resolve().parent


def sawtooth() -> None:
    report = run(RunConfig("fsdp1", 4, steps=2, model="gpt-small"))
    assert all(v is not False for v in report.match.plain().values()), report.match
    fig = viz.memory_timeline(report, ranks=[0, 1, 2, 3], layout="panels", x="event", steps=1)
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
    sawtooth()
    fsdp2_trace()


if __name__ == "__main__":
    main()
