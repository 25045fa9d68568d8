"""Dialects read from the model's own chat template (`derived`): probe, format, render, parse, grammar."""
