"""Re-draw the README's figure from a real run: FSDP1 on gpt-small over 4 ranks (gloo on CPU),
one optimizer step, a panel per rank, one tooth per unit as it is gathered and freed.

    .venv/bin/python docs/figures/make_figures.py
"""
from pathlib import Path

from zeroedu.notebook import viz
from zeroedu.train import RunConfig, run

HERE = Path(__file__).resolve().parent


def main() -> None:
    report = run(RunConfig("fsdp1", 4, steps=2, model="gpt-small"))
    assert all(v is not False for v in report.match.plain().values()), report.match
    fig = viz.memory_timeline(report, ranks=[0, 1, 2, 3], layout="panels", x="event", steps=1)
    out = HERE / "fsdp_sawtooth.png"
    fig.savefig(out, dpi=110, bbox_inches="tight")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
