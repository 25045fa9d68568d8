"""The scheduler's pure parts: how a step's prefill budget is shared (prefill_shares) and the waiting line."""

from __future__ import annotations

import random

import pytest

from zllm.runtime.scheduler import SchedulerConfig, WaitingLine, prefill_shares


def test_the_prompts_with_the_fewest_tokens_left_go_first() -> None:
    needs = [("long", 100), ("short", 3), ("medium", 10)]
    assert prefill_shares(needs, 50) == [("short", 3), ("medium", 10), ("long", 37)]
    assert prefill_shares(needs, 8) == [("short", 3), ("medium", 5)]


def test_ties_keep_arrival_order() -> None:
    assert prefill_shares([("a", 5), ("b", 5), ("c", 5)], 7) == [("a", 5), ("b", 2)]
    assert prefill_shares([("c", 5), ("b", 5), ("a", 5)], 7) == [("c", 5), ("b", 2)]


def test_a_row_takes_only_what_it_still_needs() -> None:
    assert prefill_shares([("short", 3), ("long", 100)], 500) == [("short", 3), ("long", 100)]
    assert prefill_shares([("done", 0), ("long", 100)], 50) == [("long", 50)]  # no empty share


def test_nothing_to_share() -> None:
    assert prefill_shares([], 64) == []
    assert prefill_shares([("a", 10)], 0) == []


def test_shares_respect_budget_and_needs_whatever_the_mix() -> None:
    rng = random.Random(7)
    for _ in range(500):
        needs = [(f"row{i}", rng.randrange(0, 300)) for i in range(rng.randrange(1, 8))]
        budget = rng.randrange(1, 600)
        shares = prefill_shares(needs, budget)
        need = dict(needs)
        assert len({row for row, _ in shares}) == len(shares)  # a row appears once
        assert all(0 < take <= need[row] for row, take in shares)
        assert sum(take for _, take in shares) == min(budget, sum(need.values()))  # the budget is used, not exceeded
        assert all(take == need[row] for row, take in shares[:-1])  # only the last share may be partial
        served = {row for row, _ in shares}
        waiting = [need[row] for row in need if row not in served and need[row] > 0]
        assert not waiting or min(waiting) >= max(need[row] for row in served)  # no shorter prompt left out


def test_a_short_prompt_arriving_during_a_long_prefill_is_done_at_once_and_the_long_one_still_advances() -> None:
    """Replays the engine's use: each step the rows still prefilling share the chunk."""
    left, chunk, progress = {"long": 1000}, 64, []
    for step in range(6):
        if step == 2:
            left["short"] = 20  # arrives while the long prompt is part way
        shares = dict(prefill_shares([(row, n) for row, n in left.items() if n > 0], chunk))
        progress.append(shares.get("long", 0))
        for row, take in shares.items():
            left[row] -= take
        if step == 2:
            assert left["short"] == 0
    assert all(advance > 0 for advance in progress) and sum(progress) == 6 * chunk - 20


def test_waiting_line_keeps_arrival_order_and_removes_by_identity() -> None:
    line = WaitingLine()
    first, second, third = ["same"], ["same"], ["other"]  # equal lists: removal must go by identity
    for request in (first, second, third):
        line.add(request)
    assert list(line.candidates()) == [first, second, third] and len(line) == 3
    line.remove(second)
    remaining = list(line.candidates())
    assert len(remaining) == 2 and remaining[0] is first and remaining[1] is third
    line.remove(["never added"])  # unknown: nothing happens
    assert len(line) == 2


def test_candidates_is_a_snapshot_that_allows_removal_while_iterating() -> None:
    line = WaitingLine()
    requests = [object() for _ in range(4)]
    for request in requests:
        line.add(request)
    seen = []
    for request in line.candidates():
        seen.append(request)
        line.remove(request)
    assert seen == requests and len(line) == 0


def test_waited_is_measured_on_the_injected_clock() -> None:
    now = [10.0]
    line = WaitingLine(clock=lambda: now[0])
    early, late = object(), object()
    line.add(early)
    now[0] = 12.0
    line.add(late)
    now[0] = 15.5
    assert line.waited(early) == pytest.approx(5.5) and line.waited(late) == pytest.approx(3.5)
    line.remove(early)
    assert line.waited(early) == 0.0  # no longer waiting
    assert line.waited(object()) == 0.0


def test_config_rejects_settings_that_cannot_schedule() -> None:
    for bad in ({"max_batch": 0}, {"prefill_chunk": 0}, {"idle_prefill_chunk": 0}, {"fair_wait_s": -1}):
        with pytest.raises(AssertionError):
            SchedulerConfig(**bad)


# ------------------------------------------------------------------------------------------- the step's plan

from zllm.runtime.scheduler import WaitingRequest, plan_admission, plan_prefill  # noqa: E402


def waiting(*specs) -> list[WaitingRequest]:
    """(name, need, waited_s) per request, oldest first."""
    return [WaitingRequest(name, waited_s, need=need) for name, need, waited_s in specs]


def test_admission_is_oldest_first_up_to_max_batch() -> None:
    config = SchedulerConfig(max_batch=3)
    plan = plan_admission(config, waiting(("a", 1, 0.0), ("b", 1, 0.0), ("c", 1, 0.0)), running=1, room=10)
    assert plan.start == ("a", "b") and plan.drop == ()


def test_a_request_that_does_not_fit_is_passed_until_its_fair_wait_ends() -> None:
    config = SchedulerConfig(max_batch=8, fair_wait_s=5.0)
    line = waiting(("big", 8, 1.0), ("small", 2, 0.5))
    assert plan_admission(config, line, running=1, room=4).start == ("small",)  # passed: it waited 1 s of 5
    line = waiting(("big", 8, 6.0), ("small", 2, 0.5))
    assert plan_admission(config, line, running=1, room=4).start == ()  # nobody passes it now


def test_a_lone_request_always_runs_and_room_is_spent_as_requests_start() -> None:
    config = SchedulerConfig(max_batch=8)
    assert plan_admission(config, waiting(("huge", 100, 0.0)), running=0, room=4).start == ("huge",)
    plan = plan_admission(config, waiting(("a", 3, 0.0), ("b", 3, 0.0), ("c", 1, 0.0)), running=1, room=4)
    assert plan.start == ("a", "c")  # b no longer fits once a holds 3 of the 4


def test_hung_up_requests_end_even_behind_a_full_batch_and_a_cache_off_admits_by_count() -> None:
    config = SchedulerConfig(max_batch=2)
    line = [WaitingRequest("gone", 9.0, aborted=True), WaitingRequest("next", 0.0)]
    plan = plan_admission(config, line, running=2, room=0)
    assert (plan.drop, plan.start) == (("gone",), ())
    assert plan_admission(config, line, running=0, room=None).start == ("next",)


def test_prefill_takes_the_idle_chunk_alone_and_shares_the_chunk_beside_decoding_rows() -> None:
    config = SchedulerConfig(prefill_chunk=16, idle_prefill_chunk=24)
    assert plan_prefill(config, [("long", 100)], decoding=0) == [("long", 24)]
    assert plan_prefill(config, [("long", 100)], decoding=2) == [("long", 16)]
    assert plan_prefill(config, [("a", 100), ("b", 5)], decoding=0) == [("b", 5), ("a", 11)]
