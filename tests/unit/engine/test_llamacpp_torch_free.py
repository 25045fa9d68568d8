"""Serving a GGUF on llama.cpp never imports torch or transformers: a fresh process loads the tiny GGUF model
directory through the daemon's load path, serves a plain, a sampled, a fenced (JSON Schema) and a speculative
request through the engine loop and the prefix cache, then one drafted by a GGUF draft model (--draft-model), and
only then looks at sys.modules.

(transformers' AutoConfig / AutoTokenizer import torch: ~240 MB resident of a ~1 GB server for the default
model, which is why the llama.cpp path reads config.json itself and tokenizes on `tokenizers` + jinja2.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("llama_cpp")

from tests.support.backends import tiny_gguf_model_dir  # noqa: E402

REPO = Path(__file__).resolve().parents[3]

SERVE_AND_REPORT = textwrap.dedent('''
    import asyncio, json, sys
    from pathlib import Path
    from zllm.canonical import ChatRequest, Finished, Message, ResponseFormat, SamplingParams
    from zllm.engine.select import load_for_backend
    from zllm.runtime.client import LocalEngineClient

    loaded = load_for_backend(Path(sys.argv[1]), backend="llamacpp", threads=1)
    client = LocalEngineClient(loaded, "tiny", 0, owns_engine=True, speculative=True)
    SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}

    async def serve(rid, **options):
        sampling = SamplingParams(max_tokens=8, **options.pop("sampling", {}))
        request = ChatRequest(id=rid, model="tiny", messages=(Message("user", "count to three"),),
                              sampling=sampling, **options)
        events = [event async for event in await client.submit(request)]
        return events[-1]

    async def main():
        return [await serve("plain", sampling={"temperature": 0.0}),
                await serve("sampled", sampling={"temperature": 0.8, "top_p": 0.9, "seed": 3}),
                await serve("fenced", response_format=ResponseFormat(SCHEMA)),
                await serve("plain-again", sampling={"temperature": 0.0})]

    finished = asyncio.run(main())
    client.close()
    # --draft-model: a GGUF draft (here the model itself) in its own llama.cpp context
    loaded = load_for_backend(Path(sys.argv[1]), backend="llamacpp", threads=1, uniform_rows=True)
    draft = loaded.load_draft_model(Path(sys.argv[1]) / "model.gguf", dtype="auto", threads=1)
    client = LocalEngineClient(loaded, "tiny", 0, owns_engine=True, draft_model=draft)
    finished.append(asyncio.run(serve("drafted", sampling={"temperature": 0.0})))
    client.close()
    print(json.dumps({"finished": [type(f).__name__ for f in finished],
                      "reasons": [f.reason.value for f in finished],
                      "completion": [f.usage.completion_tokens for f in finished],
                      "cached": finished[3].usage.cached_tokens,
                      "torch": "torch" in sys.modules, "transformers": "transformers" in sys.modules}))
''')


def test_serving_a_gguf_on_llamacpp_imports_neither_torch_nor_transformers() -> None:
    model_dir = tiny_gguf_model_dir("qwen3")  # built here (that uses torch), served in the child (never)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", SERVE_AND_REPORT, str(model_dir)], capture_output=True, text=True,
                          env=env, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["finished"] == ["Finished"] * 5 and "error" not in report["reasons"], report
    assert all(tokens >= 1 for tokens in report["completion"]), report
    assert report["cached"] > 0, "the repeated request hit the prefix cache"
    assert report["torch"] is False and report["transformers"] is False, report
