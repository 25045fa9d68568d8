"""Packed forwards: several requests' tokens in ONE model forward, each request attending only to its own KV.

Continuous batching on a workstation mixes rows that are nothing alike: one decodes its 900th token over a
restored 30K-token prefix, one verifies a 12-token speculative draft, one prefills a 512-token chunk. Padding
them to one rectangular batch would copy every row's KV into a padded tensor each step and waste attention on
padding. Instead the tokens are laid end to end as one sequence `[1, T]` (T = the sum of the rows' tokens):

    tokens     [ row0: 1 decode token | row1: 1 + 4 draft tokens | row2: 512 prefill tokens ]
    positions  [ 873                  | 40 41 42 43 44           | 0 .. 511                 ]

Every matrix multiply (projections, MLP, lm_head) runs once over all T tokens, which is where batching pays:
the weights are read once per step instead of once per row. Attention is the one per-row part: `PackedCache`
appends each row's new keys/values to that row's own cache (a working cache over pooled buffers, as a single
request uses), and `packed_attention` runs scaled-dot-product attention per row over exactly that row's keys,
causal within the row's new tokens. No row ever sees another row's tokens.

The attention is registered with transformers as the implementation "zllm_packed". Without a packed layout in
the call it *is* sdpa (same function, same mask), so a model switched to it serves ordinary forwards unchanged.
Models whose attention transforms the cache's output before attending (DeepSeek's MLA expands a latent) or
whose layers are not plain full attention cannot be packed: `supports_packing` probes a model by comparing a
packed forward against separate ones, and the runtime then runs rows one by one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import AttentionInterface, DynamicCache, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

PACKED_ATTENTION = "zllm_packed"


@dataclass(frozen=True)
class Segment:
    """One row's tokens in a packed forward."""

    cache: DynamicCache  # the row's own KV; the segment's tokens are appended to it
    token_ids: Sequence[int]
    all_logits: bool = False  # logits after every token (a speculative verify), else after the last only


class PackedCache:
    """Stands in for the model's cache during a packed forward: splits each layer's new keys/values by row into
    the rows' caches and keeps, per layer, each row's full keys/values for `packed_attention`."""

    def __init__(self, segments: Sequence[Segment], device: torch.device | None = None):
        self.segments = segments
        bounds, start = [], 0
        for segment in segments:
            bounds.append((start, start + len(segment.token_ids)))
            start += len(segment.token_ids)
        self.bounds = bounds  # [start, stop) of each row in the packed sequence
        self.offsets = [segment.cache.get_seq_length() for segment in segments]  # tokens each row held before
        self.row_kv: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        self._masks = [_causal_tail_mask(stop - start, offset, device)
                       for (start, stop), offset in zip(bounds, self.offsets)]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        rows = []
        for (start, stop), segment in zip(self.bounds, self.segments):
            rows.append(segment.cache.layers[layer_idx].update(key_states[..., start:stop, :],
                                                               value_states[..., start:stop, :]))
        self.row_kv[layer_idx] = rows
        # the attention reads the rows from here; what the model gets back is never attended to as a whole
        return key_states, value_states

    def attend(self, module: torch.nn.Module, query: torch.Tensor, scaling: float | None, **kwargs) -> torch.Tensor:
        """query: [1, heads, T, head_dim] → [1, T, heads, head_dim] (sdpa_attention_forward's layout)."""
        outputs = []
        for (start, stop), (keys, values), mask in zip(self.bounds, self.row_kv[module.layer_idx], self._masks):
            out, _ = sdpa_attention_forward(module, query[:, :, start:stop, :], keys, values, mask,
                                            scaling=scaling, is_causal=False, **kwargs)
            outputs.append(out)
        return outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=1)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        raise NotImplementedError("a packed forward has one length per row; positions are passed explicitly")


def _causal_tail_mask(new: int, held: int, device: torch.device | None) -> torch.Tensor | None:
    """Row-local causal mask for `new` queries appended after `held` cached tokens: query i sees keys
    0 .. held + i. None for a single query (it sees everything, as sdpa does without a mask)."""
    if new == 1:
        return None
    keys = torch.arange(held + new, device=device)
    queries = torch.arange(held, held + new, device=device)
    return (keys[None, :] <= queries[:, None])[None, None]  # [1, 1, new, held + new], True = attend


def packed_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                     packed: PackedCache | None = None, **kwargs):
    if packed is None:  # an ordinary forward: exactly sdpa
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    return packed.attend(module, query, scaling, **kwargs), None


AttentionInterface.register(PACKED_ATTENTION, packed_attention)
AttentionMaskInterface.register(PACKED_ATTENTION, sdpa_mask)

# a 4D mask is taken as prepared and passed through untouched: the packed attention builds its own per row
# (one per device, so a GPU step does not copy it from the host every time)
_NO_MASKS: dict[torch.device, torch.Tensor] = {}


def _no_mask(device: torch.device) -> torch.Tensor:
    if device not in _NO_MASKS:
        _NO_MASKS[device] = torch.zeros(1, 1, 1, 1, dtype=torch.bool, device=device)
    return _NO_MASKS[device]


def use_packed_attention(model: PreTrainedModel) -> None:
    """Switch `model` to the packed-capable attention (sdpa for every ordinary forward)."""
    model.set_attn_implementation(PACKED_ATTENTION)


def packed_forward(model: PreTrainedModel, segments: Sequence[Segment]) -> list[torch.Tensor]:
    """Run every segment's tokens in one forward, appending to each row's cache. Returns per segment its logits:
    `[vocab]` after the last token, or `[n, vocab]` after each token for `all_logits` segments."""
    assert segments and all(len(segment.token_ids) > 0 for segment in segments), "every row feeds a token"
    assert model.config._attn_implementation == PACKED_ATTENTION, "use_packed_attention(model) first"
    device = model.device
    packed = PackedCache(segments, device)
    ids = torch.tensor([[t for segment in segments for t in segment.token_ids]], dtype=torch.long, device=device)
    positions = torch.cat([torch.arange(offset, offset + len(segment.token_ids))
                           for offset, segment in zip(packed.offsets, segments)]).to(device)[None]
    keep = [position for (start, stop), segment in zip(packed.bounds, segments)
            for position in (range(start, stop) if segment.all_logits else (stop - 1,))]
    out = model(input_ids=ids, position_ids=positions, cache=packed, use_cache=True,
                attention_mask=_no_mask(device), logits_to_keep=torch.tensor(keep, device=device), packed=packed)
    logits = out.logits[0]  # [len(keep), vocab]
    results, row = [], 0
    for (start, stop), segment in zip(packed.bounds, segments):
        if segment.all_logits:
            results.append(logits[row:row + stop - start])
            row += stop - start
        else:
            results.append(logits[row])
            row += 1
    return results


def supports_packing(model: PreTrainedModel, new_cache) -> bool:
    """Whether packed forwards of this model equal separate ones: two rows, one appending to a cached prefix,
    one starting cold, compared against each row run alone. Call under inference mode."""
    prompts = ([5, 9, 2, 7], [3, 8, 1])
    try:
        alone = []
        for prompt in prompts:
            cache = new_cache()
            model(input_ids=torch.tensor([prompt[:2]], device=model.device), cache=cache, use_cache=True)
            out = model(input_ids=torch.tensor([prompt[2:]], device=model.device), cache=cache, use_cache=True)
            alone.append(out.logits[0, -1])
        caches = [new_cache(), new_cache()]
        model(input_ids=torch.tensor([prompts[0][:2]], device=model.device), cache=caches[0], use_cache=True)
        together = packed_forward(model, [Segment(caches[0], prompts[0][2:]), Segment(caches[1], prompts[1])])
        first = packed_forward(model, [Segment(caches[1], [4])])  # a row continuing after a packed forward
        reference = model(input_ids=torch.tensor([[*prompts[1], 4]], device=model.device), cache=new_cache(),
                          use_cache=True).logits[0, -1]
    except Exception:  # an architecture the packed path cannot drive at all
        return False
    tolerance = 1e-3 if model.dtype == torch.float32 else 5e-2
    pairs = [(together[0], alone[0]), (together[1], alone[1]), (first[0], reference)]
    return all(torch.allclose(a.float(), b.float(), atol=tolerance, rtol=tolerance) for a, b in pairs)
