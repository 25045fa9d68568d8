"""Issue 21's bar, measured: of llama.cpp's 70 chat templates (llama_templates.py), which write tool calls, which
dialect zllm serves each with, and whether its round trip holds. Run it to print the table:

    PYTHONPATH=. python -m tests.support.template_survey

Each template is served the way the daemon serves it (prompt/renderer.py's registry choice, prompt/dialect_check.py's
load check), over a stand-in vocabulary: the Qwen vocabulary with every marker the template's source spells
(`<｜Assistant｜>`, `<|tool_call_start|>`, `[TOOL_CALLS]`, `<arg_key>`, ...) added as a special token, as the
family's own vocabulary has it; as EOS the marker the template closes a turn of text with (Apertus'
`<|assistant_end|>`, Hy3's `<｜hy_eos:opensource｜>`: the family's EOS), `</s>` where it writes none.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

# a marker as vocabularies spell their special tokens: `<|x|>`, `<｜x｜>`, `<x>` / `</x>`, `[X_Y]`
_MARKER = re.compile(r"<[|｜][^<>'\"{}\s]{1,60}?[|｜]>|</?[A-Za-z_][A-Za-z0-9_:.\-]{0,40}>|\[[A-Z][A-Z_]{1,30}\]"
                     r"|｜[A-Z]{2,10}｜")
_NAME, _OTHER = "zqa", "zqb"


@dataclass(frozen=True)
class Entry:
    name: str
    writes_calls: bool
    how_written: str  # why the survey says it writes calls (or not)
    dialect: str = ""
    derived: bool = False
    reason: str = ""  # how the dialect was chosen, or why derivation failed
    round_trip: bool = False
    problem: str = ""
    as_written: bool = False  # the dialect writes a call as the template does (its sample is in the template's own)
    text_turn: str = ""  # what forks the cache after a turn of text ("" where it continues)
    text_turn_costs_only_the_answer: bool = False  # that fork lies after the last user message

    @property
    def holds(self) -> bool:
        return self.round_trip and self.as_written

    def line(self) -> str:
        if not self.writes_calls:
            return f"--  {self.name}: writes no calls ({self.how_written})"
        mark = "OK" if self.holds else "XX"
        how = "derived" if self.derived else "rule"
        detail = "" if self.holds else f": {self.problem}" if not self.round_trip else (
            ": the dialect writes calls otherwise than the template does (its own round trip holds, but the model "
            "was trained on the template's)")
        text = f" [text turn: {self.text_turn}]" if self.text_turn else ""
        return f"{mark}  {self.name}: {self.dialect} ({how}){detail}{text}"


def markers_of(source: str) -> list[str]:
    return sorted({m for m in _MARKER.findall(source) if "{" not in m})


def writes_calls(template_source: str) -> tuple[bool, str]:
    """Whether a conversation with a call renders the call's name more often than the same conversation with
    text in its place (the tools' declarations name it either way). Tried in the shapes templates expect
    (arguments as an object or as JSON text; OpenAI-style or flat tools; a `functions` variable)."""
    from zllm.dialects.derived.jinja import JinjaChatTemplate
    from zllm.dialects.derived.probe import PROBE_TOOLS

    template = JinjaChatTemplate(template_source, bos_token="<s>", eos_token="</s>")
    failures = []
    described = [_with_descriptions(t) for t in PROBE_TOOLS]  # Command R+ reads each parameter's description
    shapes = [(as_text, flat, declared) for as_text in (False, True) for flat in (False, True)
              for declared in (PROBE_TOOLS, described)]
    for as_text, flat, declared in shapes:
        tools = [t["function"] for t in declared] if flat else declared
        try:
            with_call = template(_conversation(as_text, calls=True), tools=tools, add_generation_prompt=True,
                                 functions=json.dumps(tools))
            without = template(_conversation(as_text, calls=False), tools=tools, add_generation_prompt=True,
                               functions=json.dumps(tools))
        except Exception as exc:  # noqa: BLE001 - a template that insists on another shape: try the next
            failures.append(f"{type(exc).__name__}: {str(exc)[:80]}")
            continue
        if with_call.count(_NAME) > without.count(_NAME):
            shape = ("arguments as JSON text" if as_text else "arguments as an object") + (
                ", flat tools" if flat else "") + (", parameters described" if declared is described else "")
            return True, f"the call's name is written ({shape})"
        return False, "a call's name never appears in the rendering"
    return False, "the template renders no probe conversation: " + "; ".join(dict.fromkeys(failures))


def _with_descriptions(tool: dict) -> dict:
    function = tool["function"]
    properties = {k: {**v, "description": f"probe {k}"} for k, v in function["parameters"]["properties"].items()}
    return {**tool, "function": {**function, "parameters": {**function["parameters"], "properties": properties}}}


def _conversation(arguments_as_text: bool, *, calls: bool) -> list[dict]:
    arguments = {"zqk1": "zq-v1"}
    call = {"id": "zqidaaaa0", "type": "function",
            "function": {"name": _NAME, "arguments": json.dumps(arguments) if arguments_as_text else arguments}}
    assistant = {"role": "assistant", "content": "" if calls else "zq-text", **({"tool_calls": [call]} if calls else {})}
    result = {"role": "tool", "content": "zq-result", "tool_call_id": "zqidaaaa0", "name": _NAME}
    return [{"role": "user", "content": "zq-user"}, assistant, result] if calls else \
        [{"role": "user", "content": "zq-user"}, assistant, {"role": "user", "content": "zq-result"}]


class StandIn:
    """One vocabulary for every template (loading it takes seconds): the base tokenizer with every template's markers
    added as special tokens; each template's view of it (`files`) shows the registry only its own markers."""

    def __init__(self, sources: list[str], base_tokenizer_json: Path):
        from tokenizers import AddedToken, Tokenizer

        self.tokenizer = Tokenizer.from_file(str(base_tokenizer_json))
        self.base_added = {token.content for token in self.tokenizer.get_added_tokens_decoder().values()}
        markers = sorted({m for source in sources for m in markers_of(source)} | {"<s>", "</s>"})
        self.tokenizer.add_special_tokens([AddedToken(m, special=True, normalized=False) for m in markers])

    def files(self, source: str, eos: str = "</s>"):
        from zllm.prompt.tokenizer_files import TokenizerFiles

        shown = self.base_added | set(markers_of(source)) | {"<s>", "</s>"}

        class _View(TokenizerFiles):
            @property
            def added_tokens_decoder(self):
                return {i: t for i, t in self.backend_tokenizer.get_added_tokens_decoder().items()
                        if t.content in shown}

        return _View(self.tokenizer, {"eos_token": eos, "bos_token": "<s>"}, source)


def text_turn_end(source: str) -> str:
    """The first marker the template closes an assistant's text with before the next user turn opens (Apertus'
    `<|assistant_end|>`, Hy3's `<｜hy_eos:opensource｜>`), unless it opens a call too (GigaChat 3's
    `<|message_sep|>`): what the family's vocabulary has as its EOS; "</s>" where there is none."""
    from zllm.dialects.derived.jinja import JinjaChatTemplate
    from zllm.dialects.derived.probe import PROBE_TOOLS

    template = JinjaChatTemplate(source, bos_token="<s>", eos_token="</s>")
    try:
        text = template(_conversation(False, calls=False), tools=PROBE_TOOLS, add_generation_prompt=True)
        calling = template(_conversation(False, calls=True), tools=PROBE_TOOLS, add_generation_prompt=True)
    except Exception:  # noqa: BLE001 - a template that insists on its own shape: the default
        return "</s>"
    # the next user turn's opener: the longest run of markers before the first user's text that the second's
    # follows too (Command R7B's `<|START_OF_TURN_TOKEN|><|USER_TOKEN|>`)
    before_user, before_result, user_open, run = (text.partition("zq-user")[0], text.partition("zq-result")[0],
                                                  "", "")
    while (found := re.search(rf"(?:{_MARKER.pattern})\s*$", before_user)) and "{" not in found.group(0):
        run, before_user = found.group(0) + run, before_user[:found.start()]
        user_open = run if before_result.endswith(run) else user_open
    closing = before_result.partition("zq-text")[2]
    closing = closing[:len(closing) - len(user_open)]
    markers = [m for m in _MARKER.findall(closing) if "{" not in m]
    opening_calls = calling.partition("zq-user")[2].partition(_NAME)[0]
    return markers[0] if markers and markers[0] not in opening_calls else "</s>"


def survey_one(name: str, source: str, stand_in: StandIn) -> Entry:
    from zllm.dialects.template_match import writes_as_template
    from zllm.prompt.dialect_check import describe_dialect
    from zllm.prompt.renderer import PromptRenderer

    writes, how = writes_calls(source)
    if not writes:
        return Entry(name, False, how)
    eos = text_turn_end(source)
    renderer = PromptRenderer(stand_in.files(source, eos))
    report = describe_dialect(renderer)
    reason = report.reason
    if not report.derived:
        from zllm.dialects.derived.dialect import derive_dialect

        reason = f"{reason} [not derived: {derive_dialect(source).reason}]"
    return Entry(name, True, how, report.dialect, report.derived, reason, report.check.held, report.check.problem,
                 writes_as_template(renderer.dialect, source, bos_token="<s>", eos_token=eos) is not False,
                 report.check.text_turn, report.check.text_turn_costs_only_the_answer)


def survey(template_dir: Path, base_tokenizer_json: Path) -> list[Entry]:
    sources = {path.stem: path.read_text() for path in sorted(template_dir.glob("*.jinja"))}
    stand_in = StandIn(list(sources.values()), base_tokenizer_json)
    return [survey_one(name, source, stand_in) for name, source in sources.items()]


def main() -> None:
    from tests.support.llama_templates import template_dir
    from tests.support.tiny_models import tiny_qwen_dir

    entries = survey(template_dir(), tiny_qwen_dir() / "tokenizer.json")
    writing = [e for e in entries if e.writes_calls]
    held = [e for e in writing if e.holds]
    print(f"{len(entries)} templates; {len(writing)} write tool calls; {len(held)} of those round-trip "
          f"({sum(e.derived for e in held)} derived, {sum(not e.derived for e in held)} hand-written); "
          f"{sum(bool(e.text_turn) for e in held)} of those fork the cache after a turn of text")
    for entry in sorted(entries, key=lambda e: (not e.writes_calls, e.holds, e.name)):
        print(entry.line())
        if entry.writes_calls and not entry.holds:
            print(f"      chosen: {entry.reason[:300]}")


if __name__ == "__main__":
    main()
