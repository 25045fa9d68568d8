"""Anthropic Messages (`POST /v1/messages`, `POST /v1/messages/count_tokens`): wire names, decode, encode, routes.

The API Claude Code speaks; design/CLIENTS.md §3 records what it sends and what it needs back.
"""
