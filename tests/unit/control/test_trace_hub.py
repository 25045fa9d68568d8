"""TraceHub: reports published from other threads land on the loop; bounded ring and bounded subscribers."""

from __future__ import annotations

import asyncio
import threading

from zllm.runtime.report import RequestReport
from zllm.runtime.trace import BroadcastRing, Feed, TraceHub


def settle(loop_thread) -> None:
    loop_thread.call(lambda: None)  # everything call_soon_threadsafe queued before this has run


def test_engine_thread_publishes_and_the_ring_keeps_finished_reports(loop_thread) -> None:
    hub = TraceHub(loop_thread.loop, capacity=3)

    def engine_thread() -> None:
        for i in range(5):
            hub.publish(RequestReport(phase="started", request_id=f"r{i}"))
            hub.publish(RequestReport(phase="finished", request_id=f"r{i}", finish_reason="stop"))
        hub.publish(RequestReport(phase="started", request_id="live"))

    worker = threading.Thread(target=engine_thread)
    worker.start()
    worker.join()
    settle(loop_thread)
    recent = loop_thread.call(hub.recent, 10)
    assert [r.request_id for r in recent] == ["r2", "r3", "r4"]  # bounded, oldest first, finished only
    assert loop_thread.call(hub.recent, 0) == []
    assert loop_thread.call(lambda: hub.running) == 1  # "live" started and has not finished
    assert loop_thread.call(hub.find, "r3").finish_reason == "stop" and loop_thread.call(hub.find, "r0") is None


def test_prefilling_requests_are_kept_with_their_newest_progress_until_they_start_or_end(loop_thread) -> None:
    hub = TraceHub(loop_thread.loop)
    for request_id, done in (("a", 0), ("b", 100), ("a", 512)):
        hub.publish(RequestReport(phase="prefilling", request_id=request_id, prompt_tokens=2048,
                                  prefilled_tokens=done))
    settle(loop_thread)
    assert [(r.request_id, r.prefilled_tokens) for r in loop_thread.call(hub.prefilling)] == [("a", 512), ("b", 100)]
    assert loop_thread.call(lambda: hub.running) == 0  # prefilling is not running (yet)
    hub.publish(RequestReport(phase="started", request_id="a"))
    hub.publish(RequestReport(phase="finished", request_id="b", finish_reason="abort"))  # aborted in its prefill
    settle(loop_thread)
    assert loop_thread.call(hub.prefilling) == [] and loop_thread.call(lambda: hub.running) == 1
    assert [r.request_id for r in loop_thread.call(hub.live)] == ["a"]
    assert [r.request_id for r in loop_thread.call(hub.recent, 10)] == ["b"]  # the ring keeps finished ones only


def test_a_subscriber_sees_both_phases_in_order(loop_thread) -> None:
    hub = TraceHub(loop_thread.loop)

    async def watch() -> list[tuple[str, str]]:
        with hub.subscribe() as feed:
            hub.publish(RequestReport(phase="started", request_id="a"))
            hub.publish(RequestReport(phase="finished", request_id="a"))
            return [((r := await feed.get()).phase, r.request_id) for _ in range(2)]

    assert loop_thread.run(watch()) == [("started", "a"), ("finished", "a")]


def test_a_slow_subscriber_loses_its_oldest_items_never_blocks() -> None:
    async def flood() -> tuple[list[int], int]:
        feed: Feed[int] = Feed(capacity=3)
        for i in range(10):
            feed.offer(i)
        return [await feed.get() for _ in range(3)], feed.dropped

    assert asyncio.run(flood()) == ([7, 8, 9], 7)


def test_publishing_after_the_loop_closed_is_dropped_quietly() -> None:
    loop = asyncio.new_event_loop()
    ring: BroadcastRing[str] = BroadcastRing(loop)
    loop.close()
    ring.publish("late")  # the engine thread finishing a request during shutdown must not raise
