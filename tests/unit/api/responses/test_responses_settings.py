"""The Responses settings: ZLLM_RESPONSES_* environment variables (bools included) and their bounds."""

from __future__ import annotations

import pytest

from zllm.config import Settings, load_settings
from zllm.errors import ConfigError


@pytest.mark.parametrize(("raw", "value"), [("0", False), ("false", False), ("Off", False), ("no", False),
                                            ("1", True), ("TRUE", True), ("on", True), ("yes", True)])
def test_websocket_switch_from_the_environment(raw, value):
    assert load_settings({"ZLLM_RESPONSES_WEBSOCKET": raw}).responses_websocket is value


def test_a_bad_bool_names_the_variable():
    with pytest.raises(ConfigError, match="ZLLM_RESPONSES_WEBSOCKET='maybe' is not a valid bool"):
        load_settings({"ZLLM_RESPONSES_WEBSOCKET": "maybe"})


def test_retention_settings_and_flags_win_over_the_environment():
    settings = load_settings({"ZLLM_RESPONSES_MAX_STORED": "5", "ZLLM_RESPONSES_MAX_AGE_DAYS": "2"},
                             responses_max_age_days=0, responses_websocket=None)
    assert (settings.responses_max_stored, settings.responses_max_age_days, settings.responses_websocket) == (
        5, 0, True)
    with pytest.raises(ConfigError):
        Settings(responses_max_stored=-1)
