"""Whether a hand-written dialect that writes its own framing (GLM XML, DSML, harmony) writes a call as the model's
own template does: the registry picks such a family by a token in the vocabulary, and one vocabulary serves
templates that write calls differently (GLM-4.6 `\\n<tool_call>NAME\\n<arg_key>` vs GLM-4.7 `<tool_call>NAME<arg_key>`;
DeepSeek V3.2's `function_calls` vs V4's `tool_calls`; DeepSeek R1's `<｜tool▁calls▁begin｜>`, no DSML at all).

    writes_as_template(dialect, facts)   # True / False, or None when the template cannot tell (renders no probe)

The dialect's own rendering of one call (round_trip.py's probe) must appear in the template's rendering of the
same conversation.
"""

from __future__ import annotations

from zllm.dialects.base import Dialect


def writes_as_template(dialect: Dialect, template_source: str | None, *, bos_token: str = "",
                       eos_token: str = "") -> bool | None:
    if dialect.needs_chat_template or getattr(dialect, "renders_its_template", False) or not template_source or "tool_calls" not in template_source:
        return None  # it renders through the template, or the template writes no calls to compare with
    from zllm.dialects.base import Conversation
    from zllm.dialects.derived.jinja import JinjaChatTemplate
    from zllm.dialects.derived.render import message_dict, tool_spec
    from zllm.dialects.round_trip import PROBE_TOOLS, probe_call_conversation

    user, turn, result = probe_call_conversation()
    try:
        prompt = dialect.render(Conversation((user,), PROBE_TOOLS, thinking=False), None)
        alone = dialect.render(Conversation((user, turn), PROBE_TOOLS, thinking=False, add_generation_prompt=False),
                               None)
        template = JinjaChatTemplate(template_source, bos_token=bos_token, eos_token=eos_token)
        own = template([message_dict(m) for m in (user, turn, result)], tools=[tool_spec(t) for t in PROBE_TOOLS],
                       add_generation_prompt=True)
    except Exception:  # noqa: BLE001 - a template that refuses the probe: it cannot tell
        return None
    if not alone.startswith(prompt):
        return None
    sample = alone[len(prompt):]
    cuts = [at for at in (sample.find(end) for end in dialect.end_of_turn if end) if at >= 0]
    sample = sample[:min(cuts)].strip() if cuts else sample.strip()
    return bool(sample) and sample in own
