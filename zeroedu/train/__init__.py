"""Training on real ranks: one run's configuration, the rank-side runner every job shares, the
single-process reference, and the launcher that assembles the report.

* `config`: `RunConfig`, resolved once in the parent (`resolve`) into a frozen `ResolvedConfig`,
  which crosses to the ranks as a plain dict and is never resolved again.
* `runner`: `build_run` / `train_steps`, the one rank-side loop.
* `reference`: single-process `torch.optim.Adam` on the global batch, the independent check.
* `launch`: `train_job` (what `zeroedu run` runs on every rank), `run`, `assemble`, `predicted`,
  `predict_time`.
* `jobs`: the other rank jobs the notebooks and tests use, built on the runner.
* `plans`: the shapes `zeroedu run` builds for a suite model on N local ranks, each with its
  runs' closed forms, ranked (`zeroedu plan --model gpt-small`).
"""
from .config import ResolvedConfig, RunConfig, config_from_dict, config_to_dict, resolve
from .launch import assemble, predict_time, predicted, run, theory_comm_options, train_job
from .reference import parameter_error, reference
from .runner import RankRun, build_run, dist_state, train_steps

__all__ = ["RunConfig", "ResolvedConfig", "resolve", "config_from_dict", "config_to_dict", "assemble", "predict_time", "predicted", "run",
           "theory_comm_options", "train_job", "reference", "parameter_error", "RankRun", "build_run", "dist_state",
           "train_steps"]
