"""The engine-owner loop and everything per request around it: detokenizer, stop conditions, the client
(client.LocalEngineClient). No JSON and no protocol names here; events are `zllm.canonical` events.
"""
