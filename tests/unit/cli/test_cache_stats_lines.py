"""`zllm cache stats` says what the SSD tier set aside as damaged, why it is off when it could not open, and the
restore-vs-recompute estimate."""

from __future__ import annotations

from zllm.cli.cache import _stats_lines

BASE = {"requests": 3, "device_hits": 1, "ssd_hits": 0, "device_bytes": 0, "device_budget_bytes": 1 << 20}


def ssd_line(stats: dict) -> str:
    return dict(_stats_lines({**BASE, **stats}))["ssd tier"]


def test_damage_set_aside_is_shown_on_the_ssd_line() -> None:
    healthy = {"ssd_bytes": 1000, "ssd_budget_bytes": 4000, "ssd_snapshots": 2, "ssd_quarantined": 0,
               "ssd_index_set_aside": 0}
    assert "set aside" not in ssd_line(healthy)
    assert ssd_line({**healthy, "ssd_quarantined": 3}).endswith("; 3 damaged set aside")
    assert ssd_line({**healthy, "ssd_quarantined": 1, "ssd_index_set_aside": 1}).endswith(
        "; 1 damaged set aside, its index set aside")
    assert ssd_line({**healthy, "ssd_quarantined": 1, "ssd_strays": 2}).endswith(
        "; 1 damaged set aside, 2 stray files set aside")


def test_a_tier_that_could_not_open_says_why() -> None:
    assert ssd_line({}) == "off"
    assert ssd_line({"ssd_off": "index.sqlite is locked by another process"}) == \
        "off (index.sqlite is locked by another process)"


def test_evictions_the_main_conversation_rule_decided_are_shown() -> None:
    assert "retention" not in dict(_stats_lines(BASE))
    assert dict(_stats_lines({**BASE, "main_spared": 4}))["retention"] == \
        "4 evictions took a side request's state, not a main conversation"


def test_the_restore_estimate_is_shown_with_its_fixed_part() -> None:
    healthy = {"ssd_bytes": 1000, "ssd_budget_bytes": 4000, "ssd_snapshots": 2}
    assert dict(_stats_lines({**BASE, **healthy}))["restore cost"] == \
        "prefill not measured, restore not measured; 0 SSD prefixes left unread (recomputing was faster)"
    measured = {"prefill_s_per_token": 0.0093, "restore_s_per_byte": 2.3e-9, "restore_s_fixed": 0.0012,
                "ssd_not_worth_it": 2}
    assert dict(_stats_lines({**BASE, **healthy, **measured}))["restore cost"] == \
        "prefill 9.30 ms/token, restore 1.2 ms + 2.30 ms/MB; 2 SSD prefixes left unread (recomputing was faster)"
    assert "restore cost" not in dict(_stats_lines(BASE))  # no SSD tier: nothing is restored
