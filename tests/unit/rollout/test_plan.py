import pytest

from gpuserve import rollout
from gpuserve.rollout import Move, batches, rollback_move, upgrade_move


def test_upgrade_move_and_noop():
    m = upgrade_move("h1", "minimax", "r1", "r2")
    assert m == Move("h1", "minimax", "r1", "r2", previous="r1")
    assert upgrade_move("h1", "minimax", "r2", "r2") is None
    assert upgrade_move("h1", "minimax", None, "r1").previous is None


def test_rollback_goes_to_previous_and_is_idempotent():
    m = rollback_move("h1", "minimax", "r2", "r1", ["r1", "r2"])
    assert (m.to_release, m.previous) == ("r1", "r1")
    # after the rollback both pointers name r1: a second rollback finds nothing to do
    assert rollback_move("h1", "minimax", "r1", "r1", ["r1", "r2"]) is None
    assert rollback_move("h1", "minimax", "r3", "r2", ["r1", "r2", "r3"], named="r1").to_release == "r1"
    with pytest.raises(ValueError, match="h1: release r9 of minimax is not on the host"):
        rollback_move("h1", "minimax", "r2", "r1", ["r1", "r2"], named="r9")
    with pytest.raises(ValueError, match="no previous release"):
        rollback_move("h1", "minimax", "r1", None, ["r1"])


def test_batches_follow_inventory_order_and_keep_a_hosts_deployments_together():
    moves = [Move("h3", "a", "x", "y", "x"), Move("h1", "a", "x", "y", "x"),
             Move("h1", "b", "x", "y", "x"), Move("h2", "a", "x", "y", "x")]
    order = ["h1", "h2", "h3", "h4"]
    one = batches(moves, order, 1)
    assert [[(m.host, m.deployment) for m in b] for b in one] == [
        [("h1", "a"), ("h1", "b")], [("h2", "a")], [("h3", "a")]]
    two = batches(moves, order, 2)
    assert [sorted({m.host for m in b}) for b in two] == [["h1", "h2"], ["h3"]]
    assert batches([], order, 1) == []
    with pytest.raises(ValueError):
        batches(moves, order, 0)


def test_pointer_commands_are_atomic_renames_guarded_by_the_release():
    cmds = rollout.pointer_commands("minimax", "r2", "r1")
    assert cmds[0] == "test -f /etc/gpuserve/minimax/releases/r2/release.json"
    assert "mv -T /etc/gpuserve/minimax/.current.new /etc/gpuserve/minimax/current" in cmds[1]
    assert "releases/r1" in cmds[2] and cmds[2].endswith("/etc/gpuserve/minimax/previous")
    assert len(rollout.pointer_commands("minimax", "r1", None)) == 2


def test_an_interrupted_move_is_resumed_not_skipped():
    # killed after the switch: current is already the target, but the host is down or drained
    m = upgrade_move("h1", "minimax", "r2", "r2", previous="r1", interrupted=True)
    assert m is not None and m.resumes and (m.to_release, m.previous) == ("r2", "r1")
    assert "interrupted rollout" in str(m)
    assert upgrade_move("h1", "minimax", "r2", "r2", previous="r1", interrupted=False) is None
    # killed before the switch: an ordinary move, previous becomes what it served
    m = upgrade_move("h1", "minimax", "r1", "r2", previous="r0", interrupted=True)
    assert not m.resumes and m.previous == "r1"
    r = rollback_move("h1", "minimax", "r1", "r1", ["r1", "r2"], interrupted=True)
    assert r.resumes and r.previous == "r1"
    assert rollback_move("h1", "minimax", "r1", "r1", ["r1", "r2"]) is None


@pytest.mark.parametrize("value, hosts, size", [
    (1, 10, 1), (3, 10, 3), ("10%", 25, 2), ("10%", 5, 1), ("50%", 4, 2), ("100%", 7, 7),
    ("34%", 3, 1), ("1%", 1, 1),
])
def test_batch_size_as_a_number_or_a_percentage_rounded_down_at_least_one(value, hosts, size):
    assert rollout.batch_size(value, hosts) == size


@pytest.mark.parametrize("value", ["0%", "101%", "10", "10 %", "%", "10%\n"])
def test_a_percentage_that_is_not_one_is_refused(value):
    with pytest.raises(ValueError):
        rollout.batch_size(value, 10)
