"""`ServedDiagnosis`: the cache diagnosis of one served model, as the engine client runs it.

    diagnosis = ServedDiagnosis(renderer, fingerprints)          # the daemon's sqlite store, or an in-memory one
    notes = diagnosis.trace_notes(request, prompt)               # the busters this request carries, for its trace
    describe = diagnosis.describer(request)                      # token index → segment, for the near-miss log
    fingerprint = diagnosis.fingerprint(request, prompt)         # kept with the admitted request
    found = diagnosis.compare_and_keep(fingerprint, namespace=…, response_id=…, previous_id=…)   # any thread
    diagnosis.kept(response_id)                                  # (namespace, CacheDiagnosis) for explain-miss --id
    diagnosis.explain_near_miss(record)                          # a near-miss record → MissExplanation

The engine client (runtime/client.py) holds one and answers its declared methods with it
(`EngineClient.diagnose_cache`, `ServedEngine.explain_near_miss` / `.cache_diagnosis`): the only way in from the
API edge and the control socket. A diagnostic never fails the request it diagnoses: a failed comparison is an
`unavailable` diagnosis, a failed save is logged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from zllm.canonical import ChatRequest
from zllm.diagnosis.busters import describe_busters, reported_busters
from zllm.diagnosis.cache_diagnosis import diagnose
from zllm.diagnosis.explain import MissExplanation, explain_near_miss
from zllm.diagnosis.fingerprint import RenderedPrompt, fingerprint_request
from zllm.diagnosis.fingerprint_store import FingerprintStore
from zllm.diagnosis.near_miss import NearMiss
from zllm.diagnosis.records import CacheDiagnosis, RequestFingerprint
from zllm.diagnosis.segments import TemplateRenderer, position_describer

log = logging.getLogger("zllm.diagnosis")


class Tokenizer(Protocol):
    def decode(self, ids: Sequence[int]) -> str: ...


class Renderer(TemplateRenderer, Protocol):
    """zllm.prompt's `PromptRenderer`, as far as diagnosis reads it."""

    @property
    def tokenizer(self) -> Tokenizer: ...


class ServedDiagnosis:
    def __init__(self, renderer: Renderer, fingerprints: FingerprintStore | None = None):
        """`fingerprints` None: an in-memory store, closed with this object (the daemon passes its sqlite one and
        closes it itself)."""
        self.renderer = renderer
        self._owns_store = fingerprints is None
        self.fingerprints = FingerprintStore.in_memory() if fingerprints is None else fingerprints

    def trace_notes(self, request: ChatRequest, prompt: RenderedPrompt) -> tuple[str, ...]:
        return describe_busters(prompt.dropped, reported_busters(request.messages))

    def describer(self, request: ChatRequest) -> Callable[[int], str]:
        return position_describer(self.renderer, request)

    def fingerprint(self, request: ChatRequest, prompt: RenderedPrompt) -> RequestFingerprint:
        return fingerprint_request(request, prompt)

    def compare_and_keep(self, current: RequestFingerprint, *, namespace: str, response_id: str,
                         previous_id: str | None) -> CacheDiagnosis | None:
        """Compare `current` with the fingerprint kept as `previous_id` (None: nothing to compare), then keep it
        as `response_id` with the diagnosis made. Blocking (sqlite, the tokenizer): off the event loop."""
        diagnosis = self._compare(current, namespace, previous_id) if previous_id else None
        try:
            self.fingerprints.save(current.with_response(response_id, namespace))
            if diagnosis is not None:
                self.fingerprints.save_diagnosis(response_id, namespace, diagnosis)
        except Exception:  # losing a fingerprint costs a later diagnosis, never this request
            log.exception("keeping the prompt fingerprint of %s failed", response_id)
        return diagnosis

    def kept(self, response_id: str) -> tuple[str, CacheDiagnosis] | None:
        """(namespace, diagnosis) made for `response_id`, in any namespace (the control socket's owner asks)."""
        return self.fingerprints.diagnosis(response_id)

    def explain_near_miss(self, record: NearMiss | Mapping[str, Any]) -> MissExplanation:
        return explain_near_miss(record)

    def close(self) -> None:
        if self._owns_store:
            self.fingerprints.close()

    def _compare(self, current: RequestFingerprint, namespace: str, previous_id: str) -> CacheDiagnosis:
        try:
            previous = self.fingerprints.load(previous_id, namespace)
            return diagnose(previous, current, compared_with=previous_id, decode=self.renderer.tokenizer.decode)
        except Exception:  # a diagnostic never fails the request
            log.exception("cache diagnosis against %s failed", previous_id)
            return CacheDiagnosis("unavailable", previous_id, detail="the diagnosis failed (see the daemon log)")
