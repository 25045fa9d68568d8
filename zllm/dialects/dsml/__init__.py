"""DeepSeek V3.2 / V4 DSML tool calls (`deepseek-v3.2`, `deepseek-v4`): dialect, format, render, parse, grammar."""
