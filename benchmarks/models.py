"""Transformers architectures through ``mp.compile``: what is captured, what runs eagerly and
why, kernels per layer, search time, error against eager.

Each architecture is built from its transformers config at a tiny size (2 layers, hidden 64, 4
heads -- 2 KV heads where the architecture groups them --, FFN 128, vocabulary 128, random
weights, float32, eval mode), run on one input (16 tokens; ViT: a 32 x 32 image of 8 x 8
patches) by PyTorch eager and by ``mp.compile`` (the CPU interpreter), and compared::

    python -m benchmarks.models                  # writes benchmarks/results/models.{json,md}
    python -m benchmarks.models --only llama gpt2

The table gives the whole model's kernels and, per layer, the kernels found over the layers
(the embedding, final norm and head included: an upper bound of a layer's own).

**Decode** (``--decode``, the causal LMs): one new token over a cache of 16 earlier ones. The
module captured takes the token id ``(1, 1)`` and each layer's cached keys and values
``(1, kv_heads, 16, head_dim)``, fills a transformers ``DynamicCache`` with them and runs the
model with ``use_cache=True``, returning the logits: the cache's concatenation, the rotary
angles at position 16 and attention of one query over 17 keys are in the program. Its output
is compared with eager on the same inputs. ``--reuse`` keeps the rows (prefill and decode)
already in the results file for the architectures not named, so decode can be added later::

    python -m benchmarks.models --only --decode llama mistral --reuse   # decode rows only

``--time-budget S`` gives the decode rows' ``mp.compile`` a time budget (the table says so).
``--covers`` prints each region's superopt summary after its row: the cover's pieces, which
operators each kernel holds (why a layer takes the kernels it does).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import platform
import time
import traceback
from pathlib import Path
from typing import Any, Callable

LAYERS, HIDDEN, HEADS, KV_HEADS, FFN, VOCAB, TOKENS = 2, 64, 4, 2, 128, 128, 16

from benchmarks._results import RESULTS, write_results

def _decoder(cls_name: str, **extra: Any) -> Callable[[], tuple[Any, dict]]:
    """A causal LM of the transformers config class ``cls_name`` at the tiny size."""
    def build():
        import torch
        import transformers
        cfg = getattr(transformers, cls_name)(
            hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=LAYERS,
            num_attention_heads=HEADS, vocab_size=VOCAB, max_position_embeddings=64,
            use_cache=False, **extra)
        cfg._attn_implementation = "sdpa"
        model = transformers.AutoModelForCausalLM.from_config(cfg)
        ids = torch.randint(0, VOCAB, (1, TOKENS), generator=torch.Generator().manual_seed(0))
        return model, {"input_ids": ids}
    return build


def _gpt2():
    import torch
    import transformers
    cfg = transformers.GPT2Config(n_embd=HIDDEN, n_inner=FFN, n_layer=LAYERS, n_head=HEADS,
                                  vocab_size=VOCAB, n_positions=64, use_cache=False)
    cfg._attn_implementation = "sdpa"
    ids = torch.randint(0, VOCAB, (1, TOKENS), generator=torch.Generator().manual_seed(0))
    return transformers.GPT2LMHeadModel(cfg), {"input_ids": ids}


def _bert():
    import torch
    import transformers
    cfg = transformers.BertConfig(hidden_size=HIDDEN, intermediate_size=FFN,
                                  num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                                  vocab_size=VOCAB, max_position_embeddings=64)
    cfg._attn_implementation = "sdpa"
    ids = torch.randint(0, VOCAB, (1, TOKENS), generator=torch.Generator().manual_seed(0))
    return transformers.BertModel(cfg, add_pooling_layer=False), {"input_ids": ids}


def _vit():
    import torch
    import transformers
    cfg = transformers.ViTConfig(hidden_size=HIDDEN, intermediate_size=FFN,
                                 num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                                 image_size=32, patch_size=8, num_channels=3)
    cfg._attn_implementation = "sdpa"
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    return transformers.ViTModel(cfg, add_pooling_layer=False), {"pixel_values": x}


ARCHITECTURES: dict[str, Callable[[], tuple[Any, dict]]] = {
    "gpt2": _gpt2,
    "bert": _bert,
    "vit": _vit,
    "llama": _decoder("LlamaConfig", num_key_value_heads=KV_HEADS, head_dim=HIDDEN // HEADS),
    "mistral": _decoder("MistralConfig", num_key_value_heads=KV_HEADS,
                        head_dim=HIDDEN // HEADS),
    "qwen2": _decoder("Qwen2Config", num_key_value_heads=KV_HEADS),
    "qwen3": _decoder("Qwen3Config", num_key_value_heads=KV_HEADS, head_dim=HIDDEN // HEADS),
    "gemma": _decoder("GemmaConfig", num_key_value_heads=KV_HEADS, head_dim=HIDDEN // HEADS),
    "phi3": _decoder("Phi3Config", num_key_value_heads=KV_HEADS, pad_token_id=0),
    "gpt_neox": _decoder("GPTNeoXConfig"),
}


DECODERS = ("gpt2", "llama", "mistral", "qwen2", "qwen3", "gemma", "phi3", "gpt_neox")
PAST = 16  # cached tokens at decode


def _decode(build: Callable[[], tuple[Any, dict]]) -> Callable[[], tuple[Any, dict]]:
    """The causal LM of ``build`` at decode: one token id over a cache of ``PAST`` tokens, the
    cache passed in as tensors (see the module docstring)."""
    def decode_build():
        import torch
        from transformers import DynamicCache
        lm, _ = build()
        cfg = lm.config
        layers = cfg.num_hidden_layers
        kv = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads

        class Decode(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.lm = lm

            def forward(self, input_ids, *past):
                cache = DynamicCache(config=cfg)
                for i in range(layers):
                    cache.update(past[2 * i], past[2 * i + 1], i)
                return self.lm(input_ids=input_ids, past_key_values=cache, use_cache=True).logits

        g = torch.Generator().manual_seed(2)
        ids = torch.randint(0, VOCAB, (1, 1), generator=g)
        past = tuple(torch.randn(1, kv, PAST, hd, generator=g) for _ in range(2 * layers))
        return Decode(), {"input_ids": ids, "past": past}
    return decode_build


def _main_output(out: Any) -> Any:
    """The model's first tensor output (logits or the last hidden state)."""
    import torch
    if isinstance(out, torch.Tensor):
        return out
    for key in ("logits", "last_hidden_state"):
        v = getattr(out, key, None)
        if v is not None:
            return v
    return out[0]


def run_one(name: str, build: Callable[[], tuple[Any, dict]],
            time_budget_s: float | None = None, covers: bool = False) -> dict[str, Any]:
    import torch
    import mirage_py as mp
    torch.manual_seed(0)
    row: dict[str, Any] = {"architecture": name}
    try:
        model, inputs = build()
        model = model.eval()
        g = torch.Generator().manual_seed(1)
        for p in model.parameters():  # random weights of a trained model's scale
            p.data = torch.randn(p.shape, generator=g) * 0.2
        past = inputs.pop("past", ())  # decode: the cache, positional after the token ids
        with torch.no_grad():
            ref = _main_output(model(*inputs.values(), *past) if past else model(**inputs))
            cm = mp.compile(model, workers=1, database=False, time_budget_s=time_budget_s)
            t0 = time.perf_counter()
            got = _main_output(cm(*inputs.values(), *past) if past else cm(**inputs))
            row["compile_s"] = round(time.perf_counter() - t0, 1)
        row["error"] = float((got - ref).norm() / ref.norm())
        regions = cm.regions()
        eager = cm.eager_ops()
        if covers:
            for cap in cm.graphs.values():
                for opt in cap.opts.values():
                    print(opt.summary(), flush=True)
        if time_budget_s is not None:
            row["time_budget_s"] = time_budget_s
        row.update(
            captured=next(iter(cm.graphs.values())).cap.method if cm.graphs else None,
            regions=len(regions),
            kernels_naive=sum(r["kernels_naive"] for r in regions),
            kernels=sum(r["kernels"] for r in regions),
            kernels_per_layer=round(sum(r["kernels"] for r in regions) / LAYERS, 1),
            search_s=round(sum(r["search_seconds"] for r in regions), 1),
            # the same program as an earlier row's (identical configs): from the memory cache
            cached=all(r["cached"] for r in regions),
            verified=all(r["verified"] for r in regions),
            eager=[f"{e['op']}: {e['reason']}" for e in eager])
    except Exception as e:  # noqa: BLE001 -- a row, not the end of the table
        row["failure"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
        row["trace"] = traceback.format_exc(limit=3)[-600:]
    return row


def markdown(doc: dict) -> str:
    out = ["# Transformers architectures through `mp.compile`", "",
           f"Made by `python -m benchmarks.models` on {doc['date']} ({doc['processor']}): "
           f"{LAYERS} layers, hidden {HIDDEN}, {HEADS} heads ({KV_HEADS} KV heads where "
           f"grouped), FFN {FFN}, vocabulary {VOCAB}, {TOKENS} tokens, random weights, "
           f"float32, CPU interpreter. *error*: norm-wise relative error of the main output "
           f"against eager. Kernels: the whole model's, naive -> found; per layer: found / "
           f"{LAYERS} (the embedding, final norm and head included).", "",
           f"*decode*: one token over a cache of {PAST} (see `benchmarks/models.py`): error, "
           "kernels naive -> found, per layer, search s, eager operators.", "",
           "| architecture | captured by | error | kernels naive -> found | per layer | "
           "search s | eager operators (why) | decode |", "|---|---|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        dec = r.get("decode")
        if dec is None:
            dec_cell = "not measured" if r["architecture"] in DECODERS else "n/a (encoder)"
        elif "failure" in dec:
            dec_cell = f"failed: {dec['failure']}"
        else:
            dec_cell = (f"{dec['error']:.1e}; {dec['kernels_naive']} -> {dec['kernels']}; "
                        f"{dec['kernels_per_layer']} a layer; {dec['search_s']} s"
                        + (f" (budget {dec['time_budget_s']:g} s)"
                           if dec.get("time_budget_s") is not None else "")
                        + (" (memory cache)" if dec.get("cached") else "") + "; eager: "
                        + ("; ".join(dec["eager"]) or "none"))
        if "failure" in r:
            out.append(f"| {r['architecture']} | failed: {r['failure']} | | | | | | {dec_cell} |")
            continue
        eager = "; ".join(r["eager"]) or "none"
        search = f"{r['search_s']}" + (" (an earlier row's program: memory cache)"
                                       if r.get("cached") else "")
        out.append(f"| {r['architecture']} | {r['captured']} | {r['error']:.1e} | "
                   f"{r['kernels_naive']} -> {r['kernels']} | {r['kernels_per_layer']} | "
                   f"{search} | {eager} | {dec_cell} |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", choices=sorted(ARCHITECTURES))
    ap.add_argument("--decode", nargs="*", choices=DECODERS, default=None,
                    help="also measure these causal LMs at decode (no names: all of them)")
    ap.add_argument("--reuse", action="store_true",
                    help="keep the results file's rows for the architectures not named")
    ap.add_argument("--out", default=str(RESULTS / "models"))
    ap.add_argument("--time-budget", type=float, default=None,
                    help="mp.compile's time_budget_s for the decode rows (default: none)")
    ap.add_argument("--covers", action="store_true",
                    help="print each region's superopt summary (its cover's pieces)")
    args = ap.parse_args(argv)
    names = list(ARCHITECTURES) if args.only is None else args.only  # `--only`: none
    decode = [] if args.decode is None else (args.decode or list(DECODERS))
    old: dict[str, dict] = {}
    if args.reuse and Path(args.out).with_suffix(".json").exists():
        old = {r["architecture"]: r for r in
               json.loads(Path(args.out).with_suffix(".json").read_text())["rows"]}
    doc = {"date": _dt.date.today().isoformat(),
           "processor": platform.processor() or platform.machine(), "rows": []}
    for name in ARCHITECTURES:
        if name not in names and name not in decode and name not in old:
            continue
        row = run_one(name, ARCHITECTURES[name], covers=args.covers) \
            if name in names or name not in old \
            else old[name]
        if name in decode:
            dec = run_one(name, _decode(ARCHITECTURES[name]), args.time_budget, args.covers)
            dec.pop("architecture", None)
            row["decode"] = dec
        elif name in old and "decode" in old[name]:
            row["decode"] = old[name]["decode"]
        doc["rows"].append(row)
        print(name, {k: v for k, v in row.items() if k != "trace"}, flush=True)
    print(write_results(args.out, doc, markdown))


if __name__ == "__main__":
    main()
