"""GLM-4.5's XML tool calls (`glm45`): dialect, render, parse, grammar."""
