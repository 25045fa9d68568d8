"""OpenAI harmony (gpt-oss): channels, `to=functions.NAME` commentary calls, `<|call|>` / `<|return|>` ends of turn."""
