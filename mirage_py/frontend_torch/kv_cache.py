"""A transformers KV cache through a compiled model: ``generate()`` with ``use_cache=True``.

transformers' ``DynamicCache`` grows its keys and values by concatenation: a step over ``P``
cached tokens attends to ``P + S`` keys, a size that is no input's size, so the captures of two
steps are no shape family (a program's sizes are input dims, not sums of them), and every token
would search again. The compiled model therefore never sees the cache object. One step is the
module :class:`CachedStep` with only tensors in and out:

* ``past``: per layer, the cached keys / values laid in a buffer of ``C = P + S`` positions whose
  last ``S`` rows are zero;
* ``place`` (``C x S``): the 0/1 matrix that puts the ``S`` new rows at positions ``P .. C-1``, so
  the keys attended are ``past + place @ new`` -- the same values as the concatenation, written
  with sizes that are all ``C`` or ``S``;
* ``mask`` (``B x 1 x S x C``, additive): causal over the positions and zero where the caller's
  ``attention_mask`` hides a position (left padding);
* ``position_ids`` as an input (the rotary embedding computed from it in the graph).

It returns the logits of every new position (keeping only the last would slice the symbolic
``S``, which a program cannot express; the head over the prompt is the price at prefill) and each
layer's new keys and values (``S`` rows), which :class:`CachedGeneration` appends to
transformers' own cache (``cache.update``), so
``generate()`` keeps its cache, stopping rules and logits processing. Two compiled step modules
serve a generation -- prefill (``P = 0``, dims ``S``) and decode (``S = 1``, dim ``C``) -- each
with the caller's ``dynamic``: with ``True`` both are shape families from their first call; with
``None`` the second step searches the family once; with ``False`` every size searches.
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import OptionError
from .capture import own_forward


def _placed_cache_type() -> type:
    """``DynamicCache`` whose ``update`` returns ``past + place @ new`` (module docstring) and
    keeps the new keys / values for the step's outputs (transformers is imported late: it is a
    test dependency, not a run-time one)."""
    from transformers import DynamicCache

    class PlacedCache(DynamicCache):
        def __init__(self, past: tuple, place: Any, config: Any):
            super().__init__(config=config)
            self.past, self.place, self.new = past, place, []

        def update(self, key_states: Any, value_states: Any, layer_idx: int, *args: Any,
                   **kwargs: Any) -> tuple[Any, Any]:
            self.new += [key_states, value_states]
            k, v = self.past[2 * layer_idx], self.past[2 * layer_idx + 1]
            return k + torch.matmul(self.place, key_states), \
                v + torch.matmul(self.place, value_states)

    return PlacedCache


class CachedStep(torch.nn.Module):
    """One generation step of a causal LM over placed past keys and values (module docstring):
    ``forward(input_ids, position_ids, mask, place, *past) -> (logits, k0, v0, k1, v1, ...)``."""

    def __init__(self, lm: Any):
        super().__init__()
        self.lm = lm

    def forward(self, input_ids: Any, position_ids: Any, mask: Any, place: Any,
                *past: Any) -> tuple:
        cache = _placed_cache_type()(past, place, self.lm.config)
        with own_forward(self.lm):  # generate() routes the model's forward to the steps
            out = self.lm(input_ids=input_ids, position_ids=position_ids, attention_mask=mask,
                          use_cache=True, cache_position=position_ids[0], logits_to_keep=0,
                          **{_cache_name(type(self.lm).forward): cache})
        return (out.logits, *cache.new)


def _cache_name(fn: Any) -> str:
    """What ``fn`` (a model's forward, or an output class's fields) calls the cache:
    ``cache`` in transformers >= 5.2x, ``past_key_values`` before."""
    import inspect
    names = getattr(fn, "__dataclass_fields__", None) or inspect.signature(fn).parameters
    return "cache" if "cache" in names else "past_key_values"


def _full_layers(cache: Any) -> list[Any]:
    """The cache's layers, each holding every position (no sliding window, no quantisation)."""
    layers = list(getattr(cache, "layers", None) or [])
    odd = sorted({type(layer).__name__ for layer in layers} - {"DynamicLayer"})
    if odd or type(cache).__name__ != "DynamicCache":
        raise OptionError(f"compile: generate() with a KV cache takes transformers' "
                          f"DynamicCache of full layers; got {type(cache).__name__}"
                          f"{' with ' + ', '.join(odd) if odd else ''} (pass use_cache=False "
                          "to generate without a cache)")
    return layers


def step_inputs(cache: Any, input_ids: Any, attention_mask: Any, num_layers: int,
                kv_shape: tuple[int, int], dtype: Any) -> tuple:
    """The tensors of one :class:`CachedStep` call: ``input_ids`` (B x S) after the cache's P
    positions; ``kv_shape`` is (key-value heads, head dim)."""
    layers = _full_layers(cache)
    b, s = input_ids.shape
    p = int(cache.get_seq_length()) if layers else 0
    c = p + s
    dev = input_ids.device
    heads, hd = kv_shape
    past = []
    for i in range(2 * num_layers):
        buf = torch.zeros(b, heads, c, hd, dtype=dtype, device=dev)
        if p:
            layer = layers[i // 2]
            buf[:, :, :p].copy_(layer.keys if i % 2 == 0 else layer.values)
        past.append(buf)
    place = torch.zeros(c, s, dtype=dtype, device=dev)
    place[p:] = torch.eye(s, dtype=dtype, device=dev)
    pos = torch.arange(c, device=dev)
    allowed = (pos[None, :] <= (p + torch.arange(s, device=dev))[:, None])[None]
    if attention_mask is not None:
        if tuple(attention_mask.shape) != (b, c):
            raise OptionError(f"compile: generate() passed an attention_mask of shape "
                              f"{tuple(attention_mask.shape)}; the cached step needs ({b}, {c})")
        allowed = allowed & attention_mask.bool()[:, None, :]
    mask = torch.zeros(b, 1, s, c, dtype=dtype, device=dev)
    mask.masked_fill_(~allowed[:, None], torch.finfo(dtype).min)
    if attention_mask is not None:  # positions count the tokens shown (left padding)
        position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, p:]
    else:
        position_ids = torch.arange(p, c, device=dev)[None].expand(b, s)
    return (input_ids, position_ids.contiguous(), mask, place, *past)


class CachedGeneration:
    """``forward`` for transformers' ``generate`` over its own ``DynamicCache``: each step runs
    a compiled :class:`CachedStep` (prefill and decode apart, see the module docstring) and
    appends the new keys and values to the cache."""

    def __init__(self, lm: Any, make_compiled: Any):
        cfg = lm.config
        self.lm = lm
        self.layers = cfg.num_hidden_layers
        heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.kv_shape = (heads, hd)
        self._make = make_compiled  # (step module, dynamic_shapes, name) -> CompiledModule
        self.steps: dict[str, Any] = {}

    def _step(self, kind: str) -> Any:
        step = self.steps.get(kind)
        if step is None:
            from torch.export import Dim
            c = Dim(f"{kind}_C")
            s = c if kind == "prefill" else None  # no cache before the prompt: S = C
            shapes: dict[str, Any] = {f"past_{i}": {2: c} for i in range(2 * self.layers)}
            shapes.update(mask={3: c} if s is None else {2: s, 3: c},
                          place={0: c} if s is None else {0: c, 1: s})
            if s is not None:
                shapes.update(input_ids={1: s}, position_ids={1: s})
            step = self.steps[kind] = self._make(CachedStep(self.lm).eval(), shapes, kind)
        return step

    def __call__(self, input_ids: Any = None, attention_mask: Any = None,
                 position_ids: Any = None, cache: Any = None, past_key_values: Any = None,
                 cache_position: Any = None, logits_to_keep: Any = None,
                 use_cache: bool = True, inputs_embeds: Any = None, **rest: Any) -> Any:
        from transformers import DynamicCache
        from transformers.modeling_outputs import CausalLMOutputWithPast
        if inputs_embeds is not None or input_ids is None:
            raise OptionError("compile: generate() with a KV cache takes token ids "
                              "(input_ids), not inputs_embeds")
        asked = sorted(k for k, v in rest.items() if v and k != "return_dict")
        if asked:
            raise OptionError(f"compile: generate() with a KV cache does not give "
                              f"{', '.join(asked)}")
        if logits_to_keep not in (None, 1):
            raise OptionError("compile: generate() with a KV cache gives the last position's "
                              f"logits only (logits_to_keep=1), not {logits_to_keep!r}")
        cache = cache if cache is not None else past_key_values
        if cache is None:
            cache = DynamicCache(config=self.lm.config)
        dtype = next(self.lm.parameters()).dtype
        x = step_inputs(cache, input_ids, attention_mask, self.layers, self.kv_shape, dtype)
        kind = "prefill" if cache.get_seq_length() == 0 else "decode"
        if kind == "decode" and input_ids.shape[1] != 1:
            kind = "extend"  # several new tokens over a cache (assisted decoding)
        if position_ids is not None:  # generate's own positions (from its attention mask)
            x = (x[0], position_ids, *x[2:])
        logits, *new = self._step(kind)(*x)
        logits = logits[:, -1:]  # generate reads the last position's
        for i in range(self.layers):
            cache.update(new[2 * i], new[2 * i + 1], i)
        return CausalLMOutputWithPast(logits=logits,
                                      **{_cache_name(CausalLMOutputWithPast): cache})

    def searches(self) -> int:
        return sum(s.searches() for s in self.steps.values())


__all__ = ["CachedStep", "CachedGeneration", "step_inputs"]
