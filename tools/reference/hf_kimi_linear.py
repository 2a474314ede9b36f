"""Build, save and run a tiny transformers `KimiLinearForCausalLM` (the independent Kimi Linear oracle).

    python hf_kimi_linear.py OUT_DIR [--seed N] [--variant tiny|awkward]

writes OUT_DIR/model/ (save_pretrained: config.json + model.safetensors, bf16-valued weights) and
OUT_DIR/hf_outputs.safetensors with transformers' own fp32 results for the fixed token sequence:
  input_ids [T] i64, logits_full [T, V], logits_incremental [T, V] (prefill PREFILL tokens, then one token at a
  time through transformers' cache), greedy_tokens [N] i64 and greedy_logits [N, V] (prefill the whole prompt,
  then greedy decode).

Run it in its own process: transformers picks fla's Triton KDA kernels when fla is importable, so fla is
hidden here (`sys.modules["fla"] = None`) and transformers falls back to its PyTorch reference code.
"""
import sys

sys.modules["fla"] = None  # noqa: E402  (must precede the transformers import)

import argparse
import json
import math
from pathlib import Path

import torch
from safetensors.torch import save_file

SEQ_LEN, PREFILL, N_GREEDY = 40, 13, 12


def awkward_config_dict():
    """Other shapes than `tiny`: KDA 3 heads x 64, MLA 3 heads (kv_lora 32, nope 16, rope 16, v 16), two
    full-attention layers, 6 experts top-2 in 2 groups (1 kept), moe_intermediate 48, hidden 96."""
    return dict(
        vocab_size=512, hidden_size=96, intermediate_size=160, moe_intermediate_size=48,
        num_hidden_layers=5, num_attention_heads=3, num_key_value_heads=3,
        layer_types=["linear_attention", "full_attention", "linear_attention", "linear_attention", "full_attention"],
        mlp_layer_types=["dense", "sparse", "sparse", "sparse", "sparse"],
        linear_num_heads=3, linear_head_dim=64, linear_conv_kernel_dim=4,
        q_lora_rank=None, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=16,
        num_local_experts=6, num_experts_per_tok=2, n_shared_experts=1, n_group=2, topk_group=1,
        norm_topk_prob=True, routed_scaling_factor=1.5, hidden_act="silu", rms_norm_eps=1e-5,
        tie_word_embeddings=False, pad_token_id=None, bos_token_id=None, eos_token_id=None,
    )


def tiny_config_dict():
    return dict(
        vocab_size=512, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
        num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4,
        layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention"],
        mlp_layer_types=["dense", "sparse", "sparse", "sparse"],
        linear_num_heads=2, linear_head_dim=128, linear_conv_kernel_dim=4,
        q_lora_rank=None, kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32,
        num_local_experts=8, num_experts_per_tok=2, n_shared_experts=1, n_group=1, topk_group=1,
        norm_topk_prob=True, routed_scaling_factor=2.446, hidden_act="silu", rms_norm_eps=1e-5,
        tie_word_embeddings=False, pad_token_id=None, bos_token_id=None, eos_token_id=None,
    )


# variant -> (config, sequence length, prefill, greedy steps)
VARIANTS = {"tiny": (tiny_config_dict, SEQ_LEN, PREFILL, N_GREEDY),
            "awkward": (awkward_config_dict, 70, 45, 8)}


def token_ids(vocab, seq_len, seed=2024):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (seq_len,), generator=g)


def init_weights(model, seed):
    """Deterministic init (N(0, 1/fan_in) projections, norms ~U(0.8,1.2), fla-style A_log/dt_bias),
    rounded to bf16 values so the bf16 checkpoint holds them exactly."""
    g = torch.Generator().manual_seed(seed)
    named = list(model.named_parameters()) + [(n, b) for n, b in model.named_buffers()
                                              if n.endswith("e_score_correction_bias")]
    with torch.no_grad():
        for name, p in sorted(named, key=lambda x: x[0]):
            shp = p.shape
            if name.endswith("A_log"):
                v = torch.log(torch.empty(shp, dtype=torch.float64).uniform_(1, 16, generator=g))
            elif name.endswith("dt_bias"):
                dt = torch.exp(torch.empty(shp, dtype=torch.float64).uniform_(math.log(1e-3), math.log(0.1), generator=g))
                v = dt + torch.log(-torch.expm1(-dt))
            elif name.endswith("e_score_correction_bias"):
                v = torch.randn(shp, generator=g, dtype=torch.float64) * 0.05
            elif "norm" in name:
                v = torch.empty(shp, dtype=torch.float64).uniform_(0.8, 1.2, generator=g)
            elif "embed_tokens" in name:
                v = torch.randn(shp, generator=g, dtype=torch.float64)
            elif "conv1d" in name:
                v = torch.randn(shp, generator=g, dtype=torch.float64) / math.sqrt(shp[-1])
            else:
                fan_in = shp[-1]
                gain = 0.5 if "f_b_proj" in name else 1.0
                v = torch.randn(shp, generator=g, dtype=torch.float64) * gain / math.sqrt(fan_in)
            p.copy_(v.to(torch.bfloat16).to(p.dtype))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=31)
    ap.add_argument("--variant", choices=sorted(VARIANTS), default="tiny")
    args = ap.parse_args()
    config_dict, seq_len, prefill, n_greedy = VARIANTS[args.variant]
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)

    import transformers
    from transformers import KimiLinearConfig, KimiLinearForCausalLM

    out = Path(args.out)
    cfg = KimiLinearConfig(**config_dict())
    torch.manual_seed(args.seed)
    model = KimiLinearForCausalLM(cfg).to(torch.float32)
    init_weights(model, args.seed)
    model_dir = out / "model"
    model.to(torch.bfloat16)
    with torch.no_grad():  # keep the fp32-by-convention tensors in fp32 (values are bf16-exact anyway)
        for name, p in list(model.named_parameters()) + list(model.named_buffers()):
            if any(s in name for s in ("A_log", "dt_bias", "conv1d", "e_score_correction_bias", "mlp.gate.weight")):
                p.data = p.data.to(torch.float32)
    model.save_pretrained(model_dir)

    m = KimiLinearForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    m.eval()
    ids = token_ids(cfg.vocab_size, seq_len)
    res = {"input_ids": ids.clone()}
    with torch.no_grad():
        res["logits_full"] = m(input_ids=ids[None], use_cache=False).logits[0].float()
        o = m(input_ids=ids[None, :prefill], use_cache=True)
        cache = o.past_key_values
        rows = [o.logits[0]]
        for t in range(prefill, seq_len):
            o = m(input_ids=ids[None, t:t + 1], past_key_values=cache, use_cache=True)
            cache = o.past_key_values
            rows.append(o.logits[0])
        res["logits_incremental"] = torch.cat(rows, 0).float()
        o = m(input_ids=ids[None], use_cache=True)
        cache, last = o.past_key_values, o.logits[0, -1]
        toks, glog = [], []
        for i in range(n_greedy):
            glog.append(last.clone())
            t = int(torch.argmax(last))
            toks.append(t)
            if i + 1 < n_greedy:
                o = m(input_ids=torch.tensor([[t]]), past_key_values=cache, use_cache=True)
                cache, last = o.past_key_values, o.logits[0, -1]
        res["greedy_tokens"] = torch.tensor(toks, dtype=torch.int64)
        res["greedy_logits"] = torch.stack(glog, 0).float()
    res = {k: v.contiguous() for k, v in res.items()}
    save_file(res, str(out / "hf_outputs.safetensors"),
              # one metadata key: safetensors writes multi-key metadata in hash order (not reproducible)
              metadata={"info": json.dumps({"transformers": transformers.__version__,
                                            "torch": torch.__version__.split("+")[0], "prefill": prefill,
                                            "seq_len": seq_len}, sort_keys=True)})
    print(json.dumps({"ok": True, "transformers": transformers.__version__}))


if __name__ == "__main__":
    main()
