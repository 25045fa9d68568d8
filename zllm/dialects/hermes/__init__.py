"""Hermes / Qwen JSON tool calls on ChatML (`hermes`, `qwen3`): dialect, render, parse, grammar, json_cursor."""
