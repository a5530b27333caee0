"""The run's mesh (`zeroedu.kinds.Mesh`): axes, groups and coordinates against a tensor laid out
by hand (torch's own row-major `reshape`, as `torch.distributed.device_mesh` lays its ranks out),
and what each configuration builds."""
import pytest
import torch

from zeroedu.kinds import DP_OUTER, DP_SHARD, PP, TP, WORLD, Mesh

pytestmark = pytest.mark.fast


def _groups_by_reshape(mesh: Mesh, name: str) -> list[tuple[int, ...]]:
    """Every group of axis `name`: the ranks along that dimension of arange(world).reshape(sizes)."""
    grid = torch.arange(mesh.world_size).reshape([s for _, s in mesh.shape])
    d = mesh.names.index(name)
    lines = grid.movedim(d, -1).reshape(-1, mesh.size(name))
    return sorted(tuple(int(r) for r in line) for line in lines)


@pytest.mark.parametrize("mesh", [
    Mesh.build(4), Mesh.build(8, dp_outer=2), Mesh.build(8, tp=2), Mesh.build(12, tp=3),
    Mesh.build(6, dp_outer=3), Mesh.build(4, dp_outer=1), Mesh(((DP_SHARD, 1), (TP, 4))),
    Mesh(((DP_OUTER, 2), (DP_SHARD, 2), (TP, 2))),
])
def test_groups_and_coordinates_are_torchs_row_major_layout(mesh):
    for name in mesh.names:
        assert sorted(mesh.groups(name)) == _groups_by_reshape(mesh, name)
        assert sorted(r for g in mesh.groups(name) for r in g) == list(range(mesh.world_size))
    for r in range(mesh.world_size):
        c = mesh.coords(r)
        assert mesh.rank_at(c) == r
        for name in mesh.names:
            assert mesh.group(r, name)[c[name]] == r
    # the ranks of one replica (along the model axes) share a batch slice; replicas cover the data axes
    assert len(mesh.replica_groups()) == mesh.data_parallel
    for k, g in enumerate(mesh.replica_groups()):
        assert {mesh.data_rank(r) for r in g} == {k}
        assert len(g) == mesh.world_size // mesh.data_parallel
    assert Mesh.from_plain(mesh.plain()) == mesh


def test_what_each_configuration_builds():
    from zeroedu.train import RunConfig

    flat = RunConfig("zero2", 4).resolved().mesh
    hybrid = RunConfig("hsdp", 8, m=2).resolved().mesh
    tp = RunConfig("fsdp2", 4, tp=2, model="gpt-tiny").resolved().mesh
    assert (flat.shape, flat.world_group_axis) == (((DP_SHARD, 4),), DP_SHARD)  # runs on the world group
    assert (hybrid.shape, hybrid.world_group_axis) == (((DP_OUTER, 2), (DP_SHARD, 4)), WORLD)
    assert (tp.shape, tp.model_axes, tp.data_parallel) == (((DP_SHARD, 2), (TP, 2)), (TP,), 2)
    assert [tp.data_rank(r) for r in range(4)] == [0, 0, 1, 1]
    assert hybrid.groups(DP_SHARD) == [(0, 1, 2, 3), (4, 5, 6, 7)]  # the inner axis is contiguous


@pytest.mark.parametrize("shape, msg", [
    (((TP, 2), (DP_SHARD, 2)), "outermost first"),
    (((DP_OUTER, 2),), "dp_shard"),
    (((DP_SHARD, 2), (DP_SHARD, 2)), "distinct"),
    ((("xp", 2), (DP_SHARD, 2)), "distinct names"),
        ((("cp", 2), (DP_SHARD, 2)), "outermost first"),
    (((DP_SHARD, 2), (PP, 2)), "outermost first"),
    (((DP_SHARD, 0),), ">= 1"),
])
def test_a_mesh_that_cannot_exist_is_refused(shape, msg):
    with pytest.raises(ValueError, match=msg):
        Mesh(shape)
    with pytest.raises(ValueError, match="divisible"):
        Mesh.build(6, tp=4)
