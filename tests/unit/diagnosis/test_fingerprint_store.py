"""The fingerprint store: round trip, namespaces, the diagnosis kept with a row, bounds, a restart."""

from __future__ import annotations

from zllm.diagnosis.fingerprint_store import FingerprintStore
from zllm.diagnosis.records import CacheDiagnosis, RequestFingerprint


def fingerprint(response_id: str, namespace: str = "ns", ids=range(1000, 1300)) -> RequestFingerprint:
    return RequestFingerprint(model="m", system="s1", tools=(("Bash", "t1"), ("Read", "t2")),
                              messages=("s1", "u1"), roles=("system", "user"),
                              options={"thinking": "None", "tool_choice": "auto:", "response_format": ""},
                              prompt_ids=tuple(ids), busters=("normalized: x-anthropic-billing-header: …",),
                              ).with_response(response_id, namespace)


def test_round_trip_within_its_namespace_only(tmp_path) -> None:
    store = FingerprintStore(tmp_path / "f.sqlite3")
    kept = fingerprint("msg_1", ids=[0, 70_000, 2**32 - 1])  # token ids beyond 16 bits survive
    store.save(kept)
    assert store.load("msg_1", "ns") == kept
    assert store.load("msg_1", "other") is None and store.load("msg_2", "ns") is None


def test_the_diagnosis_is_kept_with_its_row_and_survives_a_restart(tmp_path) -> None:
    path = tmp_path / "f.sqlite3"
    store = FingerprintStore(path)
    store.save(fingerprint("msg_2"))
    diagnosis = CacheDiagnosis("tools", "msg_1", missed_tokens=80, reusable_tokens=300, divergence=220,
                               segment="tool 1 (Read)", cause="changed_tool_schema", busters=("b",))
    store.save_diagnosis("msg_2", "ns", diagnosis)
    store.close()
    reopened = FingerprintStore(path)
    assert reopened.diagnosis("msg_2") == ("ns", diagnosis)
    assert reopened.load("msg_2", "ns") == fingerprint("msg_2")
    assert reopened.diagnosis("msg_unknown") is None


def test_bounded_to_the_newest_rows() -> None:
    store = FingerprintStore.in_memory(max_rows=3)
    for i in range(5):
        store.save(fingerprint(f"msg_{i}"))
    store.prune()
    assert store.count() == 3 and store.load("msg_0", "ns") is None and store.load("msg_4", "ns") is not None


def test_old_rows_expire() -> None:
    now = [1000.0]
    store = FingerprintStore.in_memory(max_age_s=60, clock=lambda: now[0])
    store.save(fingerprint("msg_old"))
    now[0] += 120
    store.save(fingerprint("msg_new"))
    assert store.prune() == 1 and store.load("msg_old", "ns") is None
