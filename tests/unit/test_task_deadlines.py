"""Task and plan deadlines on a fake clock: a wall-clock jump moves none of them."""

from __future__ import annotations

from meshd.tasks.deadlines import Deadlines


class Clock:
    def __init__(self) -> None:
        self.mono = 500.0
        self.wall = 1_700_000_000.0


def _deadlines(clock: Clock, capacity: int = 10) -> Deadlines:
    return Deadlines(capacity, monotonic=lambda: clock.mono, wall=lambda: clock.wall)


def test_a_wall_clock_jump_does_not_move_a_deadline() -> None:
    clock = Clock()
    d = _deadlines(clock)
    task = {"id": "t1", "created_at": clock.wall, "deadline": clock.wall + 60.0}
    assert d.left(task) == 60.0
    clock.wall += 3600.0  # an hour ahead: the task would have expired by the wall clock
    clock.mono += 10.0
    assert d.left(task) == 50.0
    clock.wall -= 7200.0  # an hour behind: it would have gained an hour
    assert d.left(task) == 50.0


def test_a_plans_tasks_end_with_the_plan() -> None:
    clock = Clock()
    d = _deadlines(clock)
    plan = {"id": "p1", "created_at": clock.wall, "deadline": clock.wall + 100.0}
    d.left(plan)
    clock.mono += 30.0
    clock.wall += 5000.0  # the wall clock jumps before the plan's next round is created
    later = {"id": "t9", "plan_id": "p1", "created_at": clock.wall, "deadline": plan["deadline"]}
    assert d.left(later) == 70.0


def test_after_a_restart_the_time_left_is_read_once_and_clamped() -> None:
    clock = Clock()
    record = {"id": "t1", "created_at": clock.wall - 20.0, "deadline": clock.wall + 40.0}
    assert _deadlines(clock).left(record) == 40.0
    clock.wall -= 86400.0  # restarted with the clock a day behind: at most what it was given
    assert _deadlines(clock).left(record) == 60.0


def test_forgotten_and_evicted_entries_are_read_again() -> None:
    clock = Clock()
    d = _deadlines(clock, capacity=2)
    records = [{"id": f"t{i}", "created_at": clock.wall, "deadline": clock.wall + 10.0 * (i + 1)}
               for i in range(3)]
    for r in records:
        d.left(r)
    assert len(d._ends) == 2  # bounded
    d.forget("t2")
    assert "t2" not in d._ends and d.left(records[2]) == 30.0
