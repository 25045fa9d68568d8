"""Why a request missed (some of) the prefix cache: the one home of zllm's cache diagnosis.

    busters.py          per-session prompt content that defeats the cache: removed (a billing header) or reported
    segments.py         which part of a rendered prompt a token falls in ("tool 1 (Read)", "message 3 (user)")
    near_miss.py        the near-miss log the prefix caches record into (a request that *almost* hit)
    fingerprint.py      a request's prompt fingerprint: digests of its parts plus its token ids
    records.py          the plain values that cross layers: `RequestFingerprint`, `CacheDiagnosis`
    fingerprint_store.py  fingerprints and diagnoses by response id (sqlite in the state dir)
    causes.py           the causes a miss can have, and the text clues behind them
    compare.py          two canonical requests: what differs between them
    explain.py          the one "why did it miss": a divergence, its segment and the windows on both sides → cause
    cache_diagnosis.py  two fingerprints → the diagnosis behind Anthropic's `diagnostics` and Responses'
                        `prompt_cache_diagnostics` (the wire shapes are the API edge's: api/cache_diagnostics.py)
    service.py          what the engine client runs: one object per served model (runtime/client.py)

The layers above enter it through the engine client's declared methods (`EngineClient.diagnose_cache` for
the API, `ServedEngine.explain_near_miss` / `.cache_diagnosis` for the control socket); `zllm/inspect` is the
offline tool over the same analysis. Below it, the prefix caches import `near_miss.py` and the renderer imports
`busters.py`; neither loads the rest. This face imports nothing, so that importing one leaf module stays cheap.
It never imports the prompt package (which imports its busters): renderers are seen through small protocols.
"""
