"""The vLLM server's keeper (engine/vllm/watchdog.py) and the wire format, without vLLM: a stand-in "vLLM Python"
(a shell script that starts children of its own, as vLLM starts its engine core and workers) is run exactly as the
real one is, and must leave no process behind — on `stop()`, on the death of its owner (kill -9), and when it
exits on its own, which is reported."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from zllm.canonical import SamplingParams
from zllm.engine.vllm import wire
from zllm.engine.vllm.server import VllmServer

FAKE_VLLM = """#!/bin/sh
# what vLLM's front process does, as far as process trees go: children, output, and a long life
sleep 600 &
sleep 600 &
echo "fake vllm up $$"
wait
"""


def fake_python(tmp_path: Path, script: str = FAKE_VLLM) -> str:
    path = tmp_path / "python"
    path.write_text(script)
    path.chmod(0o755)
    return str(path)


def group_members(pgid: int) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2:].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                members.append(int(entry.name))
    return members


def wait_for(condition, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def server_group(server: VllmServer) -> int:
    """vLLM's process group: the keeper's only child leads it."""
    assert wait_for(lambda: "fake vllm up" in server.last_lines())
    pid = int(server.last_lines().split("fake vllm up ")[1].split()[0])
    return os.getpgid(pid)


def test_stop_ends_the_server_and_its_children(tmp_path) -> None:
    server = VllmServer.start(fake_python(tmp_path), tmp_path, served_name="m", context_length=64)
    group = server_group(server)
    assert len(group_members(group)) == 3  # the script and its two children
    server.stop()
    assert wait_for(lambda: not group_members(group))


def test_a_killed_owner_takes_the_server_with_it(tmp_path) -> None:
    owner_script = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(Path(__file__).parents[3])!r})
        from pathlib import Path
        from zllm.engine.vllm.server import VllmServer
        server = VllmServer.start({fake_python(tmp_path)!r}, Path({str(tmp_path)!r}), served_name="m", context_length=64)
        while "fake vllm up" not in server.last_lines():
            time.sleep(0.05)
        print(server.last_lines().split("fake vllm up ")[1].split()[0], flush=True)
        time.sleep(600)
    """)
    owner = subprocess.Popen([sys.executable, "-c", owner_script], stdout=subprocess.PIPE, text=True)
    try:
        group = os.getpgid(int(owner.stdout.readline()))
        assert group_members(group)
        owner.send_signal(signal.SIGKILL)
        owner.wait()
        assert wait_for(lambda: not group_members(group))
    finally:
        owner.kill()


def test_a_server_that_exits_on_its_own_is_reported(tmp_path) -> None:
    exits: list[int] = []
    server = VllmServer.start(fake_python(tmp_path, "#!/bin/sh\necho 'out of memory'\nexit 3\n"), tmp_path,
                              served_name="m", context_length=64, on_exit=exits.append)
    assert wait_for(lambda: exits == [3])
    assert "out of memory" in server.last_lines()


def test_the_generate_body_and_chunks() -> None:
    body = wire.generate_body("r1", [1, 2, 3], SamplingParams(temperature=0.0, seed=-1), max_tokens=5,
                              stop_token_ids={2, 7}, grammar="start: x", salt=wire.cache_salt("ns"), model="m")
    params = body["sampling_params"]
    assert body["token_ids"] == [1, 2, 3] and body["stream"] and body["output_mode"] == "tokens"
    assert params["stop_token_ids"] == [2, 7] and params["structured_outputs"] == {"grammar": "start: x"}
    assert params["detokenize"] is False and 0 <= params["seed"] < 2**63
    assert wire.cache_salt("a") != wire.cache_salt("b") and len(wire.cache_salt("")) == 64
    chunk = wire.read_chunk('{"choices": [{"index": 0, "token_ids": [5, 6], "finish_reason": "length"}]}')
    assert chunk.token_ids == (5, 6) and chunk.finish_reason == "length"
    usage = wire.read_chunk('{"choices": [], "usage": {"prompt_tokens": 70, "completion_tokens": 2, '
                            '"prompt_tokens_details": {"cached_tokens": 64}}}')
    assert usage.usage == (70, 2, 64)
    assert wire.read_chunk('{"error": {"message": "boom", "code": 400}}').error == "boom"
    assert wire.read_chunk("[DONE]").done


def test_the_waiting_count_is_read_off_vllms_metrics() -> None:
    metrics = """# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 3.0
vllm:num_requests_waiting{engine="1",model_name="m"} 1.0
vllm:num_requests_waiting_by_reason{engine="0",model_name="m",reason="capacity"} 3.0
vllm:num_requests_running{engine="0",model_name="m"} 2.0
"""
    assert wire.waiting_requests(metrics) == 4  # both engines, and no other metric
    assert wire.waiting_requests("") == 0


def test_the_client_without_a_server(tmp_path) -> None:
    """The vLLM client is a ServedEngine; a bad tool schema is refused before anything is sent; a server that is
    not there ends the stream with Finished(ERROR), not an exception in the API layer."""
    import asyncio

    import pytest

    from tests.support.tiny_models import tiny_qwen_dir
    from zllm.canonical import ChatRequest, Finished, FinishReason, Message
    from zllm.canonical.request import FunctionTool, ToolChoice
    from zllm.control.served import ServedEngine
    from zllm.engine.vllm.client import VllmEngineClient
    from zllm.engine.vllm.server import free_port
    from zllm.errors import InvalidRequest

    async def main():
        client = VllmEngineClient.open(tiny_qwen_dir(), f"http://127.0.0.1:{free_port()}", served_model="m",
                                       name="m", created=0, context_length=256)
        try:
            assert isinstance(client, ServedEngine) and client.prefix_cache is None
            hello = (Message(role="user", content="hi"),)
            bad = FunctionTool(name="f", description="", parameters={"type": "object", "properties": {
                "x": {"type": "string", "pattern": "(unclosed"}}})
            with pytest.raises(InvalidRequest):
                await client.submit(ChatRequest(id="bad", model="m", messages=hello, tools=(bad,),
                                                tool_choice=ToolChoice(mode="required")))
            stream = await client.submit(ChatRequest(id="r", model="m", messages=hello))
            events = [event async for event in stream]
            assert isinstance(events[-1], Finished) and events[-1].reason is FinishReason.ERROR
        finally:
            await client.aclose()

    asyncio.run(main())
