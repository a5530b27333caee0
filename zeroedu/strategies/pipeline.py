"""Pipeline parallelism from scratch: zeroedu's GPT cut into p stages on a `pp` axis, GPipe and
1F1B schedules over m micro-batches, activations and their gradients sent point to point.

Algorithm (Huang et al. 2019, GPipe §2.2; Narayanan et al. 2021, §2.2, 1F1B / PipeDream-Flush).
Stage s runs L/p contiguous blocks; the first also the embedding, the last also the final
LayerNorm, the LM head and the loss. Each optimizer step's batch is cut into m micro-batches, and
every stage runs the actions `theory.pipeline.schedule` lists for it, in order:

    F i   receive micro-batch i's activation from stage s-1 (the first stage embeds the tokens),
          run the stage with autograd saving what backward needs, send the output to stage s+1
          (the last stage computes the loss, scaled by 1/m so the m backwards sum to the
          full batch's mean-loss gradient)
    B i   receive the gradient of micro-batch i's output from stage s+1 (the last stage starts
          from its loss), run backward through the stage, send the input's gradient to s-1

Gradients accumulate in each parameter's `.grad` over the m backwards; the optimizer step after
them is each stage's own (its parameters live on it alone). Sends are asynchronous and receives
block, so a stage never waits on a send and the schedules cannot deadlock: every receive's
matching send was issued by a stage that needed nothing further from the receiver.

GPipe holds all m micro-batches' activations on every stage before its first backward; 1F1B starts
backward as soon as the last stage can, so stage s holds at most min(p - s, m): p on the first
stage, whatever m is (Korthikanti et al. 2022, §4.2.3). Both leave each stage idle for
(p-1)/(m+p-1) of the step: the bubble.

Time. With every action lasting t_f (forward) or t_b (backward) on every stage, a step takes
(m + p - 1)(t_f + t_b) and each stage works m(t_f + t_b) of it. Two CPU cores cannot run four
stages at once at full speed, so a measurement of the bubble runs on an emulated device
(`EmulatedCompute`): each action computes for real and then sleeps until it has lasted t_f or t_b,
a stated model of the device's speed as `runtime.links` is of the network's. The stage marks each
action's begin (after its input arrived) and end (before its output is sent) on the timeline
(`EventKind.MICRO_FORWARD_BEGIN`, ...), and the idle fraction is read from those marks
(`reports.measured_bubble` over each stage's `reports.PipelineWork`).

Bytes per step, per stage: m activations of b·s·h elements sent forward (not on the last stage)
and m gradients of the same size backward (not on the first): 2·m·b·s·h·a across each boundary.
`theory.pipeline` has the closed forms; a run with `pp` (`splits.PipelineSplit`) measures them.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import nn

from ..kinds import EventKind
from ..runtime.comm import Axis, Comm, tag
from ..runtime.ledger import Ledger
from ..theory.pipeline import BACKWARD, FORWARD, SCHEDULES, schedule, stage_layers


@dataclass(frozen=True)
class EmulatedCompute:
    """A device whose forward on one micro-batch takes `forward` seconds and backward `backward`,
    on every stage: each action computes for real, then sleeps (costing no core) to that length.
    Set them above the real compute's time, or the measured action is the real one."""
    forward: float
    backward: float

    def __post_init__(self):
        if not (self.forward > 0 and self.backward > 0):
            raise ValueError(f"an emulated action lasts > 0 s, got forward {self.forward}, backward {self.backward}")

    def hold(self, what: str, since: float) -> None:
        """Sleep until the action begun at `since` (time.perf_counter) has lasted its length."""
        length = self.forward if what == FORWARD else self.backward
        rest = since + length - time.perf_counter()
        if rest > 0:
            time.sleep(rest)


class Stage(nn.Module):
    """Stage `stage` of `p` of a GPT: its blocks, with the embedding first and the head last."""

    def __init__(self, model: nn.Module, p: int, stage: int):
        super().__init__()
        self.p, self.index = p, stage
        layers = self.layers = stage_layers(len(model.blocks), p, stage)
        self.d_model = model.cfg.d_model
        self.loss = model.loss  # the last stage's loss (a strategy over the stage asks for it)
        self.embed = model.embed if stage == 0 else None
        self.blocks = nn.ModuleList(model.blocks[i] for i in layers)
        self.head = model.head if stage == p - 1 else None
        mine = {id(q) for q in self.parameters()}
        # the full model's names of this stage's parameters, in the model's order
        self.names = [n for n, q in model.named_parameters() if id(q) in mine]
        self.params = [q for _, q in model.named_parameters() if id(q) in mine]

    @property
    def first(self) -> bool:
        return self.index == 0

    @property
    def last(self) -> bool:
        return self.index == self.p - 1

    def units(self) -> list[nn.Module]:
        """The stage's units, for a data-parallel strategy over it: the GPT's, cut to the stage."""
        return [u for u in (self.embed, *self.blocks, self.head) if u is not None]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:
            x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x) if self.head is not None else x


class Pipeline:
    """One rank's stage of a GPT on the `pp` axis (`axis.rank` is the stage), run by a schedule.

    `data_parallel`: a function that wraps the stage module in a data-parallel strategy over the
    ranks holding the same stage (`Strategy(stage, DistState(dp axis), ...)`): each micro-batch's
    forward and backward then go through the strategy (`Strategy.forward_only` / `backward_only`,
    its hooks firing as in plain data parallelism), every backward but the step's last inside
    `no_sync()`, and the strategy's own `step()` updates the stage. Without it the stage runs bare,
    its gradients accumulating in `.grad` for the caller's optimizer.
    `compute`: an `EmulatedCompute` to pace every action to a device's speed (time lessons)."""

    def __init__(self, model: nn.Module | None, axis: Axis, comm: Comm, ledger: Ledger, schedule_kind: str = "1f1b",
                 data_parallel=None, compute: EmulatedCompute | None = None, stage: Stage | None = None):
        if schedule_kind not in SCHEDULES:
            raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, got {schedule_kind!r}")
        # `stage`: one built already (the run's spine builds it as the rank's model, `splits.PipelineSplit`)
        self.stage = stage if stage is not None else Stage(model, axis.size, axis.rank)
        self.stage_layers = self.stage.layers
        self.axis, self.comm, self.ledger, self.kind = axis, comm, ledger, schedule_kind
        self.compute = compute
        self.loss_fn = self.stage.loss
        self.d_model = self.stage.d_model
        self.strategy = data_parallel(self.stage) if data_parallel is not None else None
        self.dtype = self.strategy.param_dtype if self.strategy is not None else self.stage.params[0].dtype
        if self.strategy is None:
            for q in self.stage.params:  # the stage's weights are model states, not activations, when saved
                ledger.track(q, "param")

    def _tag(self, what: str, i: int):
        return tag("pipeline", f"stage{self.axis.rank}", "data", f"{what}{i}")

    def _begin(self, what: str, i: int) -> float:
        """The action's input is here: the stage starts working (a mark on the timeline)."""
        self.ledger.mark(EventKind.MICRO_FORWARD_BEGIN if what == FORWARD else EventKind.MICRO_BACKWARD_BEGIN, micro=i)
        return time.perf_counter()

    def _end(self, what: str, i: int, since: float) -> None:
        """The action's output is ready to send (on an emulated device, once it has lasted its length)."""
        if self.compute is not None:
            self.compute.hold(what, since)
        self.ledger.mark(EventKind.MICRO_FORWARD_END if what == FORWARD else EventKind.MICRO_BACKWARD_END, micro=i)

    def _forward(self, inp: torch.Tensor, y: torch.Tensor, m: int) -> torch.Tensor:
        """The stage on one micro-batch; on the last stage its loss (the graph keeps what
        backward needs, not the logits)."""
        st = self.stage
        if self.strategy is not None:
            out = self.strategy.forward_only(inp, y if st.last else None)
            return out  # the strategy takes the mean over micro-batches (`grad_scale`)
        with self.ledger.saving_activations():
            out = st(inp)
            if st.last:
                out = self.loss_fn(out, y) / m  # the m backwards sum to the step's mean
        self.ledger.event(EventKind.FORWARD_END)
        return out

    def _backward(self, out: torch.Tensor, grad: torch.Tensor | None, last: bool) -> None:
        if self.strategy is not None:
            self.strategy.backward_only(out, grad, sync=last)
            return
        self.ledger.mark(EventKind.BACKWARD_BEGIN)
        out.backward(grad)
        self.ledger.mark(EventKind.BACKWARD_END)

    def forward_backward(self, micro: list[tuple[torch.Tensor, torch.Tensor]]) -> float | None:
        """One optimizer step's forwards and backwards over the micro-batches `micro`, in this
        stage's schedule order; gradients accumulate in the stage (or its strategy). The mean loss
        on the last stage, None on the others."""
        st, m, ax = self.stage, len(micro), self.axis
        inputs, outputs, losses, sends = {}, {}, {}, []
        for what, i in schedule(self.kind, ax.size, m, ax.rank):
            x, y = micro[i]
            shape = (x.shape[0], x.shape[1], self.d_model)
            if what == FORWARD:
                if st.first:
                    inp = x
                else:
                    inp = torch.empty(shape, dtype=self.dtype)
                    self.comm.recv(inp, ax.rank - 1, ax, self._tag("act", i))
                    inp.requires_grad_()
                since = self._begin(what, i)
                out = self._forward(inp, y, m)
                self._end(what, i, since)
                if st.last:
                    losses[i] = out
                else:
                    sends.append(self.comm.isend(out.detach(), ax.rank + 1, ax, self._tag("act", i)))
                    outputs[i] = out
                inputs[i] = inp
            else:
                if st.last:
                    since = self._begin(what, i)
                    self._backward(losses[i], None, i == m - 1)
                else:
                    grad = torch.empty(shape, dtype=self.dtype)
                    self.comm.recv(grad, ax.rank + 1, ax, self._tag("grad", i))
                    since = self._begin(what, i)
                    self._backward(outputs.pop(i), grad, i == m - 1)
                self._end(what, i, since)
                inp = inputs.pop(i)
                if not st.first:
                    sends.append(self.comm.isend(inp.grad, ax.rank - 1, ax, self._tag("grad", i)))
        for h in sends:  # every message delivered before the step's update
            h.wait()
        if not st.last:
            return None
        total = sum(v.item() for v in losses.values())
        return float(total / m if self.strategy is not None else total)
