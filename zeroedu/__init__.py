"""zeroedu: data parallelism from scratch on torch.distributed, predicted and measured.

The subpackages are the layers, lowest first (README, "How it is built"):

    catalog, recipes, shard, fmt, optim   shared vocabulary (pure, or plain torch for Adam)
    theory/      closed forms             runtime/    ranks, comm, ledger (all instrumentation)
    models/      models and data          strategies/ one module per strategy
    train/       runner, reference, launcher
    checkpoint/, references/              sharded checkpoints; torch's own DDP / FSDP2 / DCP
    notebook/, quiz/, labs/               figures, dashboards, text tables; rehearsal; labs
    cli/                                  zeroedu memory | run | tour | quiz

A module imports only from its own layer's package and the layers below it.
"""
__version__ = "0.1.0"


def ranks(n: int, **options):
    """N local ranks for a script, owned by a `with` block that ends them:

        with zeroedu.ranks(4) as pool:
            report = zeroedu.train.run(cfg, pool=pool)   # or pool.run(job, kwargs)

    The pool's options (`backend`, `timeout`, `log_dir`, `log_cap`) are
    `zeroedu.runtime.cluster.Pool`'s. Leaving the block closes the ranks and removes their logs
    (a failed run keeps them and names them in its error)."""
    from .runtime.cluster import Pool

    return Pool(n, **options)
