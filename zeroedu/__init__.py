"""zeroedu: data parallelism from scratch on torch.distributed, predicted and measured.

Layers (see README): theory (closed forms) -> cluster (ranks) -> comm + ledger (the only
instrumentation) -> strategies (one module each) -> train -> viz/widgets -> cli.
"""
__version__ = "0.1.0"
