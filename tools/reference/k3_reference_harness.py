"""Run the public K3 reference modeling code on CPU against k31ref (K3-specific parts + whole model).

    K3_REF_MODELING=/path/to/modeling_kimi_linear.py [K3_SGLANG_SITU=/path/to/situ_and_mul.py] \
        python k3_reference_harness.py

The reference file (Ascend/MindSpeed-MM mindspeed_mm/fsdp/models/kimi_k3/modeling_kimi_linear.py) is NOT part
of this repository; fetch it yourself (see README). What running it on a CPU takes (architecture.md 11.6):
  * its `configuration_kimi_k3` module is not published: a minimal config class is supplied here;
  * MindSpeed-MM internals it imports (device flags, context-parallel helpers) are stubbed as no-ops;
  * its SiTU calls `mindspeed_mm.fsdp.ops.glu.situ.fused_situ_glu`, which is not published either: it is
    routed to sglang's `SituAndMul` (class excerpt saved outside the repo, path in K3_SGLANG_SITU), so SiTU
    is still checked against code this project did not write; without that file the test is skipped;
  * fla's Triton `chunk_kda` and `ShortConvolution` do not run on CPU: they are replaced by fla's own
    `naive_recurrent_kda` + `naive_kda_lowerbound_gate` / `naive_kda_gate`, and torch's depthwise conv1d + SiLU;
  * attention is switched to eager after construction, and a plain additive causal mask is supplied (its
    create_causal_mask call passes `input_embeds` and `cache_position`; transformers 5.24 accepts neither).
Prints one JSON object {measurement name: relative error}.
"""
import importlib.util
import json
import os
import sys
import tempfile
import types
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def _mod(name, **attrs):
    m = types.ModuleType(name)
    m.__dict__.update(attrs)
    sys.modules[name] = m
    return m


def load_reference(path, situ_path):
    # ---- fla: real naive oracles; CPU stand-ins for the Triton entry points
    import fla.modules
    import fla.ops.kda
    import fla.ops.kda.gate as fla_gate
    import fla.ops.kda.naive as fla_naive

    class TorchShortConvolution(nn.Module):
        def __init__(self, hidden_size, kernel_size, activation="silu", **kw):
            super().__init__()
            self.weight = nn.Parameter(torch.zeros(hidden_size, 1, kernel_size))
            self.activation = activation

        def forward(self, x, cache=None, output_final_state=False, cu_seqlens=None, **kw):
            T, W = x.shape[1], self.weight.shape[-1]
            y = F.conv1d(x.transpose(1, 2), self.weight, padding=W - 1, groups=x.shape[-1])[..., :T].transpose(1, 2)
            return (F.silu(y) if self.activation in ("silu", "swish") else y), None

    def chunk_kda_cpu(q, k, v, g, beta, A_log=None, dt_bias=None, initial_state=None, output_final_state=False,
                      use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False,
                      safe_gate=False, lower_bound=None, transpose_state_layout=False, cu_seqlens=None, **kw):
        assert cu_seqlens is None
        if use_qk_l2norm_in_kernel:
            q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6)
            k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
        if use_gate_in_kernel:
            if lower_bound is not None:
                g = fla_gate.naive_kda_lowerbound_gate(g, A_log, dt_bias, lower_bound=lower_bound)
            else:
                g = fla_gate.naive_kda_gate(g, A_log, dt_bias)
        if use_beta_sigmoid_in_kernel:
            beta = torch.sigmoid(beta)
        if initial_state is not None and transpose_state_layout:
            initial_state = initial_state.transpose(-1, -2)
        o, S = fla_naive.naive_recurrent_kda(q, k, v, g, beta, initial_state=initial_state, output_final_state=True)
        if transpose_state_layout:
            S = S.transpose(-1, -2)
        return o, S

    fla.modules.ShortConvolution = TorchShortConvolution
    fla.ops.kda.chunk_kda = chunk_kda_cpu

    # ---- SiTU from sglang's class (independent of this project)
    spec = importlib.util.spec_from_file_location("sglang_situ", situ_path)
    sg = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sg)

    def fused_situ_glu(x, dim=-1, beta=1.0, linear_beta=None, activate_left=True, use_fused=False):
        assert dim == -1 and activate_left
        return sg.SituAndMul(beta, linear_beta)(x)

    # ---- MindSpeed-MM internals (no-ops on one CPU process)
    for n in ["mindspeed_mm", "mindspeed_mm.fsdp", "mindspeed_mm.fsdp.utils", "mindspeed_mm.fsdp.distributed",
              "mindspeed_mm.fsdp.distributed.context_parallel", "mindspeed_mm.fsdp.ops", "mindspeed_mm.fsdp.ops.glu"]:
        _mod(n, __path__=[])
    _mod("mindspeed_mm.fsdp.utils.device", IS_NPU_AVAILABLE=False)
    _mod("mindspeed_mm.fsdp.distributed.context_parallel.communication",
         all_to_all=None, split_forward_gather_backward_with_cp=None)
    _mod("mindspeed_mm.fsdp.distributed.context_parallel.utils", generate_ulysses_cu_seqlen_params=None)
    _mod("mindspeed_mm.fsdp.distributed.parallel_state", get_parallel_state=None)
    _mod("mindspeed_mm.fsdp.ops.glu.situ", fused_situ_glu=fused_situ_glu)

    # ---- the missing configuration module
    from transformers import PretrainedConfig

    class KimiLinearConfig(PretrainedConfig):
        model_type = "kimi_linear"

        def __init__(self, **kw):
            kw.setdefault("use_fused_situ_glu", False)
            kw.setdefault("use_cache", False)
            kw.setdefault("pad_token_id", None)
            kw.setdefault("initializer_range", 0.02)
            super().__init__(**kw)

        @property
        def is_mla(self):
            return self.kv_lora_rank is not None

        def is_kda_layer(self, layer_idx):
            return self.linear_attn_config is not None and (layer_idx + 1) in self.linear_attn_config["kda_layers"]

    _mod("k3ref", __path__=[])
    _mod("k3ref.configuration_kimi_k3", KimiLinearConfig=KimiLinearConfig)
    spec = importlib.util.spec_from_file_location("k3ref.modeling_kimi_linear", path)
    ref = importlib.util.module_from_spec(spec)
    sys.modules["k3ref.modeling_kimi_linear"] = ref
    spec.loader.exec_module(ref)

    def causal_mask(config=None, input_embeds=None, inputs_embeds=None, **kw):
        x = input_embeds if input_embeds is not None else inputs_embeds
        T = x.shape[1]
        m = torch.full((T, T), float("-inf"), dtype=x.dtype).triu(1)
        return m[None, None].expand(x.shape[0], 1, T, T)

    ref.create_causal_mask = causal_mask
    return ref, KimiLinearConfig, sg


def rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).abs().max() / b.abs().max()).item()


def main():
    torch.set_num_threads(2)
    path = os.environ["K3_REF_MODELING"]
    situ_path = os.environ.get("K3_SGLANG_SITU", "/work/ref-src/sglang/situ_and_mul.py")
    ref, Cfg, sg = load_reference(path, situ_path)
    from k31ref import Model, ops, randinit
    from k31ref.checkpoint import load_weights

    res = {}
    # ------------------------------------------------------------- whole tiny K3 (no DSA)
    tc = randinit.tiny_text_config(vocab_size=512)
    for k in [k for k in tc if k.startswith("index_")]:
        del tc[k]
    w = randinit.random_k31_weights(tc, seed=77)
    with tempfile.TemporaryDirectory() as d:
        randinit.save_k31_checkpoint(d, tc, w)
        ours = Model.load(d, dtype=torch.float64)
        dense = load_weights(Path(d))
    cfg = Cfg(**{k: v for k, v in tc.items() if k not in ("architectures", "model_type", "quantization_config")})
    model = ref.KimiLinearForCausalLM(cfg).float().eval()
    model.config._attn_implementation = "eager"
    sd = {k: v.to(torch.float32) for k, v in dense.items()}
    missing, unexpected = model.load_state_dict(sd, strict=False)
    assert not unexpected, unexpected
    assert not missing, missing

    T = 40
    ids = torch.randint(0, 512, (T,), generator=torch.Generator().manual_seed(5))
    caps = {}

    def hook(name):
        def f(mod, args, kwargs, out):
            x = args[0] if args else kwargs["hidden_states"]
            caps[name] = (x.detach().clone(), (out[0] if isinstance(out, tuple) else out).detach().clone())
        return f

    hooks = []
    for l, layer in enumerate(model.model.layers):
        hooks.append(layer.self_attn.register_forward_hook(hook(f"{l}.mixer"), with_kwargs=True))
        ffn = layer.block_sparse_moe if hasattr(layer, "block_sparse_moe") else layer.mlp
        hooks.append(ffn.register_forward_hook(hook(f"{l}.ffn"), with_kwargs=True))
        if hasattr(layer, "block_sparse_moe"):
            hooks.append(layer.block_sparse_moe.gate.register_forward_hook(hook(f"{l}.gate"), with_kwargs=True))
    with torch.no_grad():
        out = model(input_ids=ids[None], use_cache=False)
        hidden = out.hidden_states[0]
        logits_ref = hidden @ model.lm_head.weight.t()
    rec = {}
    logits = ours.forward(ids, None, rec)
    res["K3 whole model (tiny, no DSA): logits vs K3 reference, fp32 ref"] = rel(logits, logits_ref)

    # per component, each fed the reference's own input
    worst = {"kda": 0.0, "mla": 0.0, "moe": 0.0, "dense": 0.0, "router_w": 0.0}
    route_mismatch = 0
    for l in range(cfg.num_hidden_layers):
        x, y = caps[f"{l}.mixer"]
        x = x[0].double()
        cache = ours.new_cache()
        mine = ours.kda(l, x, cache, None, "") if ours.cfg.layer_kinds[l] == "kda" else ours.mla(l, x, cache, None, "")
        kind = ours.cfg.layer_kinds[l]
        worst[kind] = max(worst[kind], rel(mine, y[0]))
        x, y = caps[f"{l}.ffn"]
        x = x[0].double()
        if ours.cfg.ffn_kinds[l] == "dense":
            worst["dense"] = max(worst["dense"], rel(ours.dense(l, x), y[0]))
        else:
            r2 = {}
            worst["moe"] = max(worst["moe"], rel(ours.moe(l, x, r2, ""), y[0]))
            gi, gw = caps[f"{l}.gate"][1], None
            ref_idx, ref_w = model.model.layers[l].block_sparse_moe.gate(caps[f"{l}.gate"][0])
            for t in range(T):
                a = dict(zip(r2["router.idx"][t].tolist(), r2["router.weights"][t].tolist()))
                b = dict(zip(ref_idx[t].tolist(), ref_w[t].tolist()))
                if set(a) != set(b):
                    route_mismatch += 1
                    continue
                worst["router_w"] = max(worst["router_w"], max(abs(a[e] - b[e]) for e in a))
    res["K3 KDA layers (bounded gate, full-rank g_proj, short conv) vs KimiDeltaAttention"] = worst["kda"]
    res["K3 gated NoPE MLA (dense) vs KimiMLAAttention"] = worst["mla"]
    res["K3 LatentMoE (MXFP4 experts, SiTU, shared) vs KimiSparseMoeBlock"] = worst["moe"]
    res["K3 dense SiTU MLP (layer 0) vs KimiMLP"] = worst["dense"]
    res["K3 router: max |weight diff| vs KimiMoEGate (abs)"] = worst["router_w"]
    res["K3 router: tokens with a different expert set (count)"] = float(route_mismatch)

    # ------------------------------------------------------------- K3 code with Kimi-Linear-style KDA gates
    tc2 = json.loads(json.dumps(tc))
    tc2["linear_attn_config"].pop("gate_lower_bound")
    tc2["linear_attn_config"]["use_full_rank_gate"] = False
    w2 = randinit.random_k31_weights(tc2, seed=78)
    with tempfile.TemporaryDirectory() as d:
        randinit.save_k31_checkpoint(d, tc2, w2)
        ours2 = Model.load(d, dtype=torch.float64)
        dense2 = load_weights(Path(d))
    cfg2 = Cfg(**{k: v for k, v in tc2.items() if k not in ("architectures", "model_type", "quantization_config")})
    model2 = ref.KimiLinearForCausalLM(cfg2).float().eval()
    model2.config._attn_implementation = "eager"
    missing, unexpected = model2.load_state_dict({k: v.to(torch.float32) for k, v in dense2.items()}, strict=False)
    assert not missing and not unexpected, (missing, unexpected)
    with torch.no_grad():
        h2 = model2(input_ids=ids[None], use_cache=False).hidden_states[0]
    res["K3 code with softplus gate + low-rank g_a/g_b (tiny, no DSA): logits"] = rel(
        ours2.forward(ids), h2 @ model2.lm_head.weight.t())

    # ------------------------------------------------------------- the committed K3.1 tiny golden, dense prefix
    gdir = HERE.parents[1] / "tests" / "golden" / "k31_tiny"
    if (gdir / "outputs.safetensors").exists():
        from safetensors.torch import load_file
        gtc = json.loads((gdir / "model" / "config.json").read_text())["text_config"]
        topk = gtc["index_topk"]
        gtc = {k: v for k, v in gtc.items() if not k.startswith("index_")}
        gcfg = Cfg(**{k: v for k, v in gtc.items() if k not in ("architectures", "model_type", "quantization_config")})
        gm = ref.KimiLinearForCausalLM(gcfg).float().eval()
        gm.config._attn_implementation = "eager"
        gw = {k: v.to(torch.float32) for k, v in load_weights(gdir / "model").items() if ".indexer." not in k}
        missing, unexpected = gm.load_state_dict(gw, strict=False)
        assert not missing and not unexpected, (missing, unexpected)
        gold = load_file(str(gdir / "outputs.safetensors"))
        with torch.no_grad():
            h = gm(input_ids=gold["input_ids"][None, :topk], use_cache=False).hidden_states[0]
        res["golden k31_tiny logits rows < index_topk (DSA selects all = dense) vs K3 reference"] = rel(
            h @ gm.lm_head.weight.t(), gold["logits_full"][:topk])

    # ------------------------------------------------------------- AttnRes operator, 2..9 sources
    g = torch.Generator().manual_seed(11)
    d = 256
    norm = ref.KimiRMSNorm(d, eps=1e-5)
    proj = nn.Linear(d, 1, bias=False)
    err = 0.0
    with torch.no_grad():
        for n in range(2, 10):
            norm.weight.copy_(torch.rand(d, generator=g) + 0.5)
            proj.weight.copy_(torch.randn(1, d, generator=g) / d ** 0.5)
            srcs = torch.randn(33, n, d, generator=g) * (torch.rand(1, n, 1, generator=g) * 3 + 0.1)
            r_out = ref._apply_attn_res(srcs[:, -1], srcs[:, :-1], proj, norm)
            o_out, _ = ops.attn_res(srcs.double(), norm.weight.double(), proj.weight.double(), 1e-5)
            err = max(err, rel(o_out, r_out))
    res["AttnRes aggregation, 2..9 sources vs _apply_attn_res"] = err

    # ------------------------------------------------------------- SiTU vs sglang SituAndMul (through K3 code)
    x = torch.randn(64, 2 * 96, generator=g) * 8
    r_out = ref.SituAndMul(beta=4.0, linear_beta=25.0)(x)
    o_out = ops.situ(x[:, :96].double(), x[:, 96:].double(), 4.0, 25.0)
    res["SiTU(beta 4, linear beta 25) vs K3 SituAndMul -> sglang SituAndMul"] = rel(o_out, r_out)
    r_out = ref.SituAndMul(beta=4.0, linear_beta=None)(x)
    res["SiTU(beta 4, no linear beta) vs K3 SituAndMul -> sglang SituAndMul"] = rel(
        ops.situ(x[:, :96].double(), x[:, 96:].double(), 4.0, None), r_out)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
