import pytest

from horovod_hetero.rules.grouping import (butterfly_group, butterfly_groups, distinct_partitions, nearest_group_size,
                                            partition_index)


def test_the_papers_worked_example():
    assert butterfly_groups(8, 4, 0) == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert butterfly_groups(8, 4, 1) == [(0, 1, 4, 5), (2, 3, 6, 7)]


@pytest.mark.parametrize("P,S", [(1, 1), (2, 1), (2, 2), (4, 2), (8, 2), (8, 4), (16, 4), (32, 8), (64, 8), (8, 8)])
def test_every_step_is_a_partition_into_groups_of_size_s(P, S):
    for t in range(12):
        groups = butterfly_groups(P, S, t)
        assert sorted(r for g in groups for r in g) == list(range(P))
        assert all(len(g) == S for g in groups) and len(groups) == P // S


def test_groups_change_every_step_and_mix_all_ranks():
    assert butterfly_groups(4, 2, 0) == [(0, 1), (2, 3)]
    assert butterfly_groups(4, 2, 1) == [(0, 2), (1, 3)]
    assert butterfly_groups(4, 2, 2) == [(0, 1), (2, 3)]
    # over log2 P / log2 S consecutive steps the union of pairings connects rank 0 to everyone
    reach = {0}
    for t in range(3):
        for g in butterfly_groups(8, 2, t):
            if reach & set(g):
                reach |= set(g)
    assert reach == set(range(8))


def test_distinct_partitions_cover_every_step_in_first_use_order():
    parts = distinct_partitions(8, 4)
    assert parts[0] == butterfly_groups(8, 4, 0) and parts[1] == butterfly_groups(8, 4, 1)
    assert len(parts) == 3
    for t in range(20):
        assert parts[partition_index(8, 4, t)] == butterfly_groups(8, 4, t)
    assert distinct_partitions(1, 1) == [[(0,)]]
    assert distinct_partitions(4, 4) == [[(0, 1, 2, 3)]]


def test_nearest_group_size():
    assert [nearest_group_size(p) for p in (1, 2, 4, 8, 16, 64, 256)] == [1, 2, 2, 4, 4, 8, 16]


@pytest.mark.parametrize("P,S,match", [(6, 2, "P must be a power of two"), (8, 3, "S must be a power of two"),
                                       (4, 8, "must be <= P"), (0, 1, "P must be"), (8, 0, "S must be")])
def test_bad_sizes_name_the_argument_and_the_fix(P, S, match):
    with pytest.raises(ValueError, match=match):
        butterfly_groups(P, S, 0)


def test_power_of_two_error_suggests_a_group_size():
    with pytest.raises(ValueError, match=r"e\.g\. 4"):
        butterfly_groups(16, 3, 0)


def test_one_ranks_group_is_its_group_in_the_partition():
    for P, S in [(1, 1), (2, 2), (8, 2), (8, 4), (16, 4), (32, 8)]:
        for t in range(6):
            partition = butterfly_groups(P, S, t)
            assert [butterfly_group(P, S, t, r) for r in range(P)] == [g for r in range(P) for g in partition if r in g]
