"""`zllm serve --rpc`: the default model's F16 GGUF split over two llama.cpp rpc-servers on 127.0.0.1 answers the
same greedy text as on this machine alone, `zllm ps` says where the weights went, and a server another client
holds is a clear error (rpc-server serves one client at a time) instead of a hung load. Without the RPC backend,
`--rpc` fails with the rebuild command.

The rpc-servers and the RPC backend module come from .ci/llama-rpc (tests/support/llama_rpc.py; skips without).
"""

from __future__ import annotations

import time

import openai
import pytest

from tests.integration.conftest import linked_data_dir
from tests.support.daemon import Daemon
from tests.support.default_gguf import NAME, default_f16_data_dir
from tests.support.llama_rpc import llama_rpc_build, rpc_servers
from zllm.errors import ConfigError

pytest.importorskip("llama_cpp")
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

SYSTEM = "You are a careful programming assistant. Answer with short, correct Python code. " * 20  # > 256 tokens


def conversation(daemon: Daemon) -> tuple[list[str], int]:
    """Two greedy turns, the second on top of the first (a prefix cache hit: cells shared in the pool and
    snapshotted to the SSD tier, both on the RPC servers' buffers); the answers and turn 2's cached tokens."""
    client = openai.OpenAI(base_url=f"{daemon.base_url}/v1", api_key="unused", max_retries=0, timeout=120)
    messages = [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": "Write a function that returns the n-th Fibonacci number."}]
    answers, cached = [], 0
    for follow_up in ("Now make it iterative.", None):
        reply = client.chat.completions.create(model=NAME, messages=messages, temperature=0, max_tokens=40)
        answers.append(reply.choices[0].message.content)
        cached = reply.usage.prompt_tokens_details.cached_tokens
        assert reply.usage.completion_tokens == 40  # long greedy runs, not early stops
        if follow_up:
            messages += [{"role": "assistant", "content": answers[-1]}, {"role": "user", "content": follow_up}]
    return answers, cached


def served(data_dir, *args: str) -> tuple[Daemon, float]:
    start = time.monotonic()
    daemon = Daemon(data_dir, NAME, *args).wait_ready(timeout=180)
    return daemon, time.monotonic() - start


def test_two_rpc_servers_answer_like_this_machine(tmp_path) -> None:
    from zllm.engine.llamacpp.rpc import handshake

    build = llama_rpc_build()
    data_dir = linked_data_dir(default_f16_data_dir(), tmp_path)
    local, local_load = served(data_dir)
    try:
        expected, _ = conversation(local)
    finally:
        local.stop()
    with rpc_servers(2, build) as endpoints:
        remote, remote_load = served(data_dir, "--rpc", ",".join(endpoints),
                                     "--rpc-backend", str(build / "libggml-rpc.so"))
        try:
            answers, cached = conversation(remote)
            assert answers == expected
            assert cached > 256
            (model,) = remote.control().ps()
            assert model.backend == "llamacpp"
            for endpoint in endpoints:  # llama.cpp's own account: a model buffer on each server
                assert f"[{endpoint}]" in model.backend_reason, model.backend_reason
            with pytest.raises(ConfigError, match="did not answer"):  # the daemon holds it
                handshake(endpoints[0], timeout=1.0)
        finally:
            remote.stop()
        assert handshake(endpoints[0]) == (7, 0, 0)  # free again once the daemon is gone
    print(f"load: local {local_load:.1f} s, over 2 rpc-servers {remote_load:.1f} s")


def test_rpc_on_a_build_without_it_says_how_to_rebuild(tmp_path) -> None:
    import llama_cpp

    if llama_cpp.llama_supports_rpc():
        pytest.skip("this llama-cpp-python was built with the RPC backend")
    daemon = Daemon(linked_data_dir(default_f16_data_dir(), tmp_path), NAME, "--rpc", "127.0.0.1:50052")
    with pytest.raises(RuntimeError, match="daemon exited") as failure:
        daemon.wait_ready(timeout=120)
    assert "built without llama.cpp's RPC backend" in str(failure.value)
    assert 'CMAKE_ARGS="-DGGML_RPC=ON"' in str(failure.value)
