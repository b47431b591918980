"""Tiny Llama checkpoints for the real SGLang server on a CPU (run with the SGLang environment's Python).

`random`: a randomly initialised `LlamaForCausalLM` (hidden 64, 2 layers) whose
vocabulary is the tokenizer's: real attention over the whole prompt, so the
prefix cache, batching and sampling of the real engine are all exercised.

`trace`: the same shape, but its weights choose its output. With every
attention and MLP output projection zeroed, the residual stream at the last
position is that token's embedding, so the next token is decided by the last
token alone: each source token gets its own orthonormal direction as its
embedding, and the row of `lm_head` for the token that must follow it is that
direction, scaled so that the chosen token's logit is ~80 above every other
(sampled at any temperature, it is the only token with any weight). A chain
`after -> emit[0] -> emit[1] -> ... -> EOS` then makes every prompt whose last
token is `after` answer exactly `emit`. No training: the weights are written.

    python make_model.py OUT --tokenizer DIR [--trace CHAINS.json] [--context 4096] [--vocab N]

`--vocab N` gives the model fewer ids than its tokenizer has (a tokenizer with
added tokens the model was never resized for): the server's `/tokenize` then
gives those ids, and the engine dies on them.

CHAINS.json: {"chains": [{"after": [id, ...], "emit": [id, ..., eos]}, ...]}.
A token named by no chain follows the first chain, as if it were an `after`.
"""
from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

HIDDEN, LAYERS, HEADS, KV_HEADS, INTERMEDIATE = 64, 2, 4, 2, 128
LOGIT_GAP = 80.0  # the chosen token's logit above every other's, after the final RMSNorm


def config(vocab: int, context: int, eos: int, bos: int, tied: bool) -> LlamaConfig:
    return LlamaConfig(vocab_size=vocab, hidden_size=HIDDEN, intermediate_size=INTERMEDIATE,
                       num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                       max_position_embeddings=context, tie_word_embeddings=tied, eos_token_id=eos,
                       bos_token_id=bos, torch_dtype="bfloat16")


def follow(chains: list[dict]) -> dict[int, int]:
    """Each source token's next token; a token with two different successors is an error."""
    nxt: dict[int, int] = {}
    for chain in chains:
        emit = [int(t) for t in chain["emit"]]
        for source, target in [*((int(a), emit[0]) for a in chain["after"]), *zip(emit, emit[1:])]:
            if nxt.setdefault(source, target) != target:
                raise SystemExit(f"token {source} would be followed by both {nxt[source]} and {target}")
    return nxt


def write_trace(model: LlamaForCausalLM, chains: list[dict]) -> None:
    nxt = follow(chains)
    sources = sorted(nxt)
    if len(sources) > HIDDEN:
        raise SystemExit(f"{len(sources)} source tokens need {len(sources)} directions; the model has {HIDDEN}")
    default = int(chains[0]["after"][0])
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        directions = torch.eye(HIDDEN)
        embed, head = model.model.embed_tokens.weight, model.lm_head.weight
        embed.copy_(directions[sources.index(default)].expand_as(embed))
        head.zero_()
        # RMSNorm scales a unit vector by sqrt(HIDDEN): the chosen logit is the scale x sqrt(HIDDEN)
        scale = LOGIT_GAP / HIDDEN ** 0.5
        for i, source in enumerate(sources):
            embed[source] = directions[i]
            head[nxt[source]] += scale * directions[i]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--tokenizer", type=Path, required=True)
    parser.add_argument("--trace", type=Path)
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--vocab", type=int, help="the model's vocabulary size (default: the tokenizer's length)")
    args = parser.parse_args()
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(str(args.tokenizer))
    torch.manual_seed(0)
    cfg = config(args.vocab or len(tokenizer), args.context, tokenizer.eos_token_id, tokenizer.bos_token_id, tied=not args.trace)
    model = LlamaForCausalLM(cfg)
    if args.trace:
        write_trace(model, json.loads(args.trace.read_text())["chains"])
    model.to(torch.bfloat16)
    tmp = args.out.with_name(args.out.name + ".part")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    tmp.rename(args.out)


if __name__ == "__main__":
    main()
