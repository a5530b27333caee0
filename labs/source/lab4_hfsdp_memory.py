"""Lab 4: an HFSDP memory estimate, as a pure function.

HFSDP arranges M·N GPUs as M domains of N: inside a domain (mesh axis dp_shard) it is ZeRO-3,
so parameters, gradients and optimizer state are each cut N ways; across domains (dp_outer) it
is ZeRO-1, so the optimizer state is cut M more ways, while parameters and gradients are
replicated across domains.

Bytes per parameter come from the precision recipe: `zeroedu.recipes.get_recipe(name)` has
`param_bytes` (P), `grad_bytes` (G) and `optim_bytes` (K). Count model states only (no
activations, no temporary gathered layers).

Graded (10 points, on five visible cases and, with --hidden, on random Ψ, N, M and recipes,
against zeroedu.theory):  param 2;  grad 2;  optim 4;  total 2.

Check your work:  python -m zeroedu.labs check 4
"""
from zeroedu import recipes


def hfsdp_bytes_per_gpu(psi, n: int, m: int, recipe: str = "mixed-bf16") -> dict:
    """Model-state bytes on one GPU: {"param": ..., "grad": ..., "optim": ..., "total": ...}."""
    # BEGIN SOLUTION write the four byte counts from the recipe's P, G, K and the two shard factors
    r = recipes.get_recipe(recipe)
    param = r.param_bytes * psi / n
    grad = r.grad_bytes * psi / n
    optim = r.optim_bytes * psi / (n * m)
    return {"param": param, "grad": grad, "optim": optim, "total": param + grad + optim}
    # END SOLUTION
