"""OpenAI Chat Completions (`POST /v1/chat/completions`): wire names, decode, encode, route."""
