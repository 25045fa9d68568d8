"""The Ollama API (`/api/chat`, `/api/generate`, `/api/tags`, `/api/pull`, ...): wire names, decode, encode,
routes. Same port and same canonical form as the OpenAI and Anthropic APIs, so the same prefix cache."""
