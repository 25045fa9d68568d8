"""ModelRunner: our own prefill + decode loop reproduces HF generate; kept caches extend exactly."""

import copy

import torch

from zllm.engine.torch.runner import ModelRunner

PROMPT = [9707, 1879, 0, 151645, 198, 151644, 77091, 198]  # "Hello world!<|im_end|>\n<|im_start|>assistant\n"


def hf_greedy(model, prompt: list[int], n: int) -> list[int]:
    """`generate()` with EOS disabled so it runs exactly n steps; explicit mask (no pad-id guessing)."""
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                         eos_token_id=None, pad_token_id=None)
    return out[0, len(prompt):].tolist()


def greedy_decode(runner: ModelRunner, prompt: list[int], n: int) -> list[int]:
    cache = runner.new_cache()
    with torch.inference_mode():
        logits = runner.prefill(prompt, cache)
        out = []
        for _ in range(n):
            token = logits.argmax().view(1, 1)
            out.append(int(token))
            logits = runner.decode(token, cache)
    return out


def test_greedy_loop_equals_generate(tiny_qwen) -> None:
    model = tiny_qwen.model
    n = 40
    with torch.inference_mode():
        reference = hf_greedy(model, PROMPT, n)
    assert len(reference) == n
    assert greedy_decode(ModelRunner(model), PROMPT, n) == reference


def test_greedy_loop_equals_generate_on_llama(tiny_llama) -> None:
    model = tiny_llama.model
    prompt = tiny_llama.tokenizer.encode("[INST] Hello world [/INST]")
    with torch.inference_mode():
        reference = hf_greedy(model, prompt, 20)
    assert greedy_decode(ModelRunner(model), prompt, 20) == reference


def prefill_logits(runner: ModelRunner, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return runner.prefill(ids, runner.new_cache())


def test_append_prefill_on_a_kept_cache_equals_a_full_prefill(tiny_qwen) -> None:
    runner = ModelRunner(tiny_qwen.model)
    ids = list(range(1000, 1060))
    full = prefill_logits(runner, ids)
    cache = runner.new_cache()
    with torch.inference_mode():
        runner.prefill(ids[:37], cache)
        appended = runner.prefill(ids[37:], cache)
    assert cache.get_seq_length() == len(ids)
    torch.testing.assert_close(appended, full, atol=1e-5, rtol=1e-5)


def test_next_turn_on_a_cache_kept_after_decoding_equals_a_full_prefill(tiny_qwen) -> None:
    """The prefix-cache pattern: turn 1 prefilled and decoded, turn 2 appended to the same cache."""
    runner = ModelRunner(tiny_qwen.model)
    cache = runner.new_cache()
    generated = []
    with torch.inference_mode():
        logits = runner.prefill(PROMPT, cache)
        for _ in range(5):
            token = logits.argmax().view(1, 1)
            generated.append(int(token))
            logits = runner.decode(token, cache)
        # the last sampled token is in `generated` but its KV is: decode() appended it
        snapshot = copy.deepcopy(cache)
        next_turn = [151645, 198, 151644, 872, 198, 9707]
        appended = runner.prefill(next_turn, snapshot)
    full = prefill_logits(runner, PROMPT + generated + next_turn)
    torch.testing.assert_close(appended, full, atol=1e-5, rtol=1e-5)


def test_chunked_prefill_equals_one_shot(tiny_qwen) -> None:
    ids = list(range(2000, 2100))
    chunked = prefill_logits(ModelRunner(tiny_qwen.model, prefill_chunk=7), ids)
    torch.testing.assert_close(chunked, prefill_logits(ModelRunner(tiny_qwen.model), ids), atol=1e-5, rtol=1e-5)


def test_prefill_stops_between_chunks_when_asked(tiny_qwen) -> None:
    runner = ModelRunner(tiny_qwen.model, prefill_chunk=10)
    cache = runner.new_cache()
    checks = iter([False, False, True])
    with torch.inference_mode():
        assert runner.prefill(list(range(100, 150)), cache, should_stop=lambda: next(checks)) is None
    assert cache.get_seq_length() == 20


def test_logits_are_one_row_over_the_vocabulary(tiny_qwen) -> None:
    logits = prefill_logits(ModelRunner(tiny_qwen.model), PROMPT)
    assert logits.shape == (tiny_qwen.model.config.vocab_size,)
