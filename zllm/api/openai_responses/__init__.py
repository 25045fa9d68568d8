"""OpenAI Responses (`/v1/responses`, HTTP SSE and WebSocket): wire names, decode, encode, chain, routes."""
