"""The restore-vs-recompute estimate (kvcache/cost.py): a restore's fixed cost, learned as fixed + bytes x rate."""

from __future__ import annotations

import json

import pytest

from zllm.kvcache.cost import RESTORE_FIXED_S, CostModel

MB = 1 << 20
FIXED, RATE = 0.010, 1e-9  # 10 ms a restore, ~1 GB/s: a machine where opening and loading cost something


def measured(sizes=(100 * MB, 200 * MB), repeats: int = 3, fixed: float = FIXED) -> CostModel:
    """A model that watched restores of `sizes` taking fixed + size x RATE, and prefills of 1 ms a token."""
    model = CostModel()
    model.observe_prefill(1000, 1.0)
    for _ in range(repeats):
        for size in sizes:
            model.observe_restore(size, fixed + size * RATE)
    return model


def test_the_fixed_part_and_the_rate_are_learned_from_restores_of_two_sizes() -> None:
    model = measured()
    assert model.restore_s_fixed == pytest.approx(FIXED, rel=0.02)
    assert model.restore_s_per_byte == pytest.approx(RATE, rel=0.02)


def test_a_restore_sparing_a_few_tokens_does_not_pay_and_a_long_one_still_does() -> None:
    # only long restores were seen (the fixed part is 5-10% of each): a rate alone would make a 1 MB restore
    # 1 ms, cheaper than 5 tokens of prefill (5 ms); with the fixed part it is 11 ms
    model = measured()
    assert not model.restore_pays(5, 1 * MB)
    assert model.restore_pays(20, 1 * MB)  # 20 ms of prefill against 11 ms (x SAFETY) of restore
    assert model.restore_pays(1000, 100 * MB)


def test_restores_of_one_size_leave_the_fixed_part_at_its_measured_default() -> None:
    model = measured(sizes=(50 * MB,))
    assert model.restore_s_fixed == pytest.approx(RESTORE_FIXED_S)
    assert model.restore_s_fixed + 50 * MB * model.restore_s_per_byte == pytest.approx(FIXED + 50 * MB * RATE)


def test_noisy_restores_never_give_a_negative_fixed_part_or_rate() -> None:
    model = measured(fixed=-0.05)  # larger restores relatively quicker: the line would cross zero below 50 MB
    assert model.restore_s_fixed == 0.0 and model.restore_s_per_byte > 0


def test_the_fit_survives_a_restart_and_an_older_daemons_estimate_still_loads() -> None:
    model = measured()
    again = CostModel.from_json(model.to_json())
    assert (again.restore_s_fixed, again.restore_s_per_byte, again.prefill_s_per_token) == pytest.approx(
        (model.restore_s_fixed, model.restore_s_per_byte, model.prefill_s_per_token))
    older = CostModel.from_json(json.dumps({"prefill_s_per_token": 1e-3, "restore_s_per_byte": 2e-9}))
    assert (older.restore_s_fixed, older.restore_s_per_byte) == (RESTORE_FIXED_S, 2e-9)
    assert CostModel.from_json('{"restore_sums": [1, "x", 2, 3, 4]}').restore_sums == (0.0,) * 5
