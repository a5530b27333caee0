"""Numeric drills: random sizing questions, graded by `zeroedu.theory`, with worked solutions.

A drill is drawn from a seed (`random.Random(seed)`): a model size Ψ, N ranks (and M domains for
hybrid strategies), a precision recipe and a strategy, and one of three questions:

* ``bytes``: model-state bytes per GPU (answer in GB);
* ``comm``: bytes one rank sends per training step under the ring model (GB);
* ``fits``: do the model states fit one 80 GB GPU (yes / no)?

The expected value is the theory's output (`theory.model_states`, `theory.comm_per_rank`,
`theory.fits`). An answer within `TOLERANCE` (1 %) counts. The worked solution writes the same
closed form with the numbers substituted, term by term, built from the recipe's byte counts and
the strategy's per-axis ZeRO levels in `zeroedu.catalog`, so it explains where each byte comes
from rather than restating the result.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from fractions import Fraction

from ..answers import parse_quantity, read_quantity
from .. import catalog, recipes, theory
from ..catalog import shards
from .deck import fmt_number

KINDS = ("bytes", "comm", "fits")
TOLERANCE = 0.01  # relative
GPU_BYTES = 80e9
STRATEGIES = ("ddp", "zero1", "zero1_allreduce", "zero2", "fsdp1", "fsdp2", "megatron_distopt",
              "hsdp", "hfsdp")
TOPIC_STRATEGIES = {
    "ddp": ("ddp",),
    "zero": ("zero1", "zero1_allreduce", "zero2", "fsdp1"),
    "fsdp": ("fsdp1", "fsdp2"),
    "megatron": ("megatron_distopt",),
    "hybrid": ("hsdp", "hfsdp"),
    # deck topics with no strategy of their own draw from every strategy
    "comm": STRATEGIES, "memory": STRATEGIES, "training": STRATEGIES, "composition": STRATEGIES,
}
# and ask the question kind the topic is about (default: every kind)
TOPIC_KINDS = {"comm": ("comm",), "memory": ("bytes", "fits")}
PSIS = (125e6, 1.3e9, 7e9, 8e9, 13e9, 30e9, 70e9, 175e9)
NS = (2, 4, 8, 16, 32, 64)
MS = (2, 4)

_NAMES = {"ddp": "DDP", "zero1": "ZeRO-1", "zero1_allreduce": "ZeRO-1 coded with all-reduce",
          "zero2": "ZeRO-2", "fsdp1": "ZeRO-3 / FSDP1", "fsdp2": "FSDP2",
          "megatron_distopt": "Megatron distributed optimizer", "hsdp": "HSDP", "hfsdp": "HFSDP"}


def gb(x) -> str:
    return fmt_number(float(x) / 1e9, 5) + " GB"


def psi_text(psi) -> str:
    psi = float(psi)
    return fmt_number(psi / 1e9, 4) + "B" if psi >= 1e9 else fmt_number(psi / 1e6, 4) + "M"


def psi_num(psi) -> str:
    """7e9 -> '7e9', 1.3e9 -> '1.3e9', 125e6 -> '125e6': readable in a formula."""
    psi = float(psi)
    return fmt_number(psi / 1e9, 6) + "e9" if psi >= 1e9 else fmt_number(psi / 1e6, 6) + "e6"


@dataclass(frozen=True)
class Drill:
    kind: str
    strategy: str
    psi: float
    n: int
    m: int
    recipe: str

    # ------------------------------------------------------------ the question
    def setting(self) -> str:
        mesh = f"M = {self.m} domains × N = {self.n} GPUs" if self.hybrid else f"N = {self.n} GPUs"
        return (f"{_NAMES[self.strategy]}, Ψ = {psi_text(self.psi)} parameters, {mesh}, "
                f"recipe {self.recipe}")

    @property
    def hybrid(self) -> bool:
        return catalog.get_spec(self.strategy).hybrid

    def prompt(self) -> str:
        q = {"bytes": "model-state bytes per GPU? (GB)",
             "comm": "bytes one rank sends per training step? (GB, ring model)",
             "fits": f"do the model states fit one {fmt_number(GPU_BYTES / 1e9)} GB GPU? (yes/no)"}
        return f"{self.setting()}: {q[self.kind]}"

    # ------------------------------------------------------------ the answer
    def expected(self):
        """Bytes (exact Fraction) for bytes/comm, a bool for fits: straight from the theory."""
        if self.kind == "bytes":
            return theory.model_states(self.strategy, self.psi, self.n, self.m, self.recipe).total
        if self.kind == "comm":
            return theory.comm_per_rank(self.strategy, self.psi, self.n, self.m, self.recipe).total()
        return theory.fits(self.strategy, self.psi, self.n, self.m, self.recipe, gpu_bytes=GPU_BYTES)

    def expected_text(self) -> str:
        e = self.expected()
        return ("yes" if e else "no") if self.kind == "fits" else gb(e)

    def grade(self, answer: str) -> tuple[bool, str]:
        """(correct?, one-line verdict). Never raises on odd input."""
        if self.kind == "fits":
            got = parse_yes_no(answer)
            if got is None:
                return False, f"could not read {answer.strip()!r} as yes/no; the answer is {self.expected_text()}"
            ok = got == self.expected()
            return ok, ("correct" if ok else f"wrong: the answer is {self.expected_text()}")
        got = parse_bytes(answer)
        if got is None:
            return False, f"could not read {answer.strip()!r} as a size; the answer is {self.expected_text()}"
        exp = float(self.expected())
        ok = abs(got - exp) <= TOLERANCE * max(abs(exp), 1.0)
        return ok, ("correct" if ok else f"wrong: you said {gb(got)}, the answer is {self.expected_text()}")

    # ------------------------------------------------------------ the worked solution
    def worked(self) -> str:
        return {"bytes": self._worked_bytes, "comm": self._worked_comm, "fits": self._worked_fits}[self.kind]()

    def _worked_bytes(self) -> str:
        spec = catalog.get_spec(self.strategy)
        rec = recipes.get_recipe(self.recipe)
        n, m, psi = self.n, (self.m if spec.hybrid else 1), self.psi
        parts = [("param", "P", rec.param_bytes, "param"), ("grad", "G", rec.grad_bytes, "grad"),
                 ("optimizer", "K", rec.optim_bytes, "optim")]
        lines = [f"{self.setting()}.",
                 f"Recipe {rec.name}: P = {rec.param_bytes} (param {rec.param}), G = {rec.grad_bytes} "
                 f"(grad {rec.grad}), K = {rec.optim_bytes} ({' + '.join(f'{k} {v}' for k, v in rec.optim_parts().items())}) bytes/param.",
                 f"Levels: dp_shard {spec.inner}" + (f", dp_outer {spec.outer}" if spec.hybrid else "") + "."]
        total = Fraction(0)
        for label, sym, b, cat in parts:
            div, why = 1, []
            if shards(spec.inner)[cat]:
                div *= n
                why.append("N")
            if spec.hybrid and shards(spec.outer)[cat]:
                div *= m
                why.append("M")
            val = Fraction(psi) * b / div
            total += val
            den = f" / {div}" if div > 1 else ""
            form = f"{sym}·Ψ" + ({0: "", 1: f"/{''.join(why)}"}.get(len(why), f"/({'·'.join(why)})"))
            lines.append(f"  {label:<9} {form:<11} = {b} × {psi_num(psi)}{den} = {gb(val)}")
        lines.append(f"  total = {gb(total)}")
        return "\n".join(lines)

    def _worked_comm(self) -> str:
        c = theory.comm_per_rank(self.strategy, self.psi, self.n, self.m, self.recipe)
        rec = recipes.get_recipe(self.recipe)
        lines = [f"{self.setting()}.",
                 "Ring model: reduce-scatter / all-gather of S bytes over g ranks send (g-1)/g · S; "
                 "all-reduce sends 2(g-1)/g · S. Gradients travel in the grad dtype "
                 f"({rec.grad_bytes} B), parameters in the param dtype ({rec.param_bytes} B)."]
        for op in c.ops:
            k = 2 if op.collective == "all_reduce" else 1
            elems = Fraction(op.nbytes)
            lines.append(f"  {op.axis:<8} {op.collective:<14} {op.tag:<20} "
                         f"{'2 × ' if k == 2 else ''}({op.group}-1)/{op.group} × {gb(elems)} = {gb(op.sent)}")
        lines.append(f"  total = {gb(c.total())}")
        return "\n".join(lines)

    def _worked_fits(self) -> str:
        ms = theory.model_states(self.strategy, self.psi, self.n, self.m, self.recipe)
        verdict = "fits" if ms.total <= GPU_BYTES else "does not fit"
        bytes_drill = Drill("bytes", self.strategy, self.psi, self.n, self.m, self.recipe)
        return (bytes_drill._worked_bytes() + f"\n  {gb(ms.total)} vs {gb(GPU_BYTES)}: {verdict} "
                "(model states only; activations and gathered units need room on top).")


def parse_bytes(text: str) -> float | None:
    """'37.4', '37.4 GB', '37.4e9', '37400 MB', '0.0374 TB' -> bytes (`answers.parse_quantity`).
    A bare number below 1e6 is read as GB (the unit the prompt asks for); larger bare numbers as
    bytes."""
    read = read_quantity(text)
    if read is None:
        return None
    value, unit = read
    if unit == "":
        return value * 1e9 if abs(value) < 1e6 else value
    return parse_quantity(text, "bytes")


def parse_yes_no(text: str) -> bool | None:
    t = text.strip().lower()
    if t in ("y", "yes", "true", "fits", "1", "是", "能"):
        return True
    if t in ("n", "no", "false", "0", "否", "不能"):
        return False
    return None


def make_drill(rng: random.Random, kinds=KINDS, strategies=STRATEGIES) -> Drill:
    kind = rng.choice(tuple(kinds))
    strategy = rng.choice(tuple(strategies))
    spec = catalog.get_spec(strategy)
    recipe = rng.choice((spec.default_recipe, spec.default_recipe, *recipes.RECIPES))
    return Drill(kind, strategy, rng.choice(PSIS), rng.choice(NS),
                 rng.choice(MS) if spec.hybrid else 1, recipe)


def draw_drills(k: int, seed: int = 0, topic: str | None = None, kinds=None) -> list[Drill]:
    """`k` drills, the same ones for the same seed (and topic). `kinds` defaults to the topic's
    (`TOPIC_KINDS`), else every kind."""
    if topic in (None, "all"):
        strategies = STRATEGIES
    elif topic in TOPIC_STRATEGIES:
        strategies = TOPIC_STRATEGIES[topic]
    else:
        raise ValueError(f"unknown topic {topic!r}; choose one of {', '.join(TOPIC_STRATEGIES)}, all")
    if kinds is None:
        kinds = TOPIC_KINDS.get(topic, KINDS)
    rng = random.Random(seed)
    return [make_drill(rng, kinds, strategies) for _ in range(k)]


__all__ = ["Drill", "KINDS", "TOLERANCE", "GPU_BYTES", "STRATEGIES", "TOPIC_STRATEGIES", "TOPIC_KINDS",
           "draw_drills", "make_drill", "parse_bytes", "parse_yes_no", "gb"]
