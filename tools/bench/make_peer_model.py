"""Make the random Qwen3-MoE checkpoint used for the peer comparison in BENCHMARKS.md.

hidden 512, 8 layers, 32 experts top-4, moe_intermediate 256, vocab 8192 (~115M parameters),
seeded, saved with save_pretrained in f32 (and a bf16 copy) so that transformers, llama.cpp
(via convert_hf_to_gguf.py) and specfit all load the same weights.

    tools/.venv/bin/python tools/bench/make_peer_model.py --out bench-models/peer115m
"""
import argparse
import pathlib

import torch
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench-models/peer115m")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    cfg = Qwen3MoeConfig(
        vocab_size=8192, hidden_size=512, intermediate_size=1024, moe_intermediate_size=256,
        num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4, head_dim=64,
        num_experts=32, num_experts_per_tok=4, norm_topk_prob=True,
        max_position_embeddings=4096, rope_theta=1e6, tie_word_embeddings=False,
        bos_token_id=1, eos_token_id=2,
    )
    model = Qwen3MoeForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.uniform_(0.5, 1.5)
            else:
                p.normal_(0.0, 1.0 / p.shape[-1] ** 0.5)
    out = pathlib.Path(args.out)
    n = sum(p.numel() for p in model.parameters())
    model.save_pretrained(out / "f32", safe_serialization=True)
    model.to(torch.bfloat16).save_pretrained(out / "bf16", safe_serialization=True)
    print(f"{n / 1e6:.1f}M parameters -> {out}/f32, {out}/bf16")


if __name__ == "__main__":
    main()
