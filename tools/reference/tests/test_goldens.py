"""The committed goldens: checked against the independent oracles, against k31ref, and for reproducibility."""
import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from conftest import REF_DIR, REPO, rel_err
from k31ref import Model, ops

GOLD = REPO / "tests" / "golden"
pytestmark = pytest.mark.skipif(not (GOLD / "MANIFEST.json").exists(), reason="tests/golden not generated")


def _cases(prefix_file):
    t = load_file(str(GOLD / "ops" / prefix_file))
    names = sorted({k.split(".")[0] for k in t})
    return t, names


def test_kda_goldens_vs_fla(measure):
    naive = pytest.importorskip("fla.ops.kda.naive")
    gate = pytest.importorskip("fla.ops.kda.gate")
    t, names = _cases("kda.safetensors")
    worst_o = worst_S = 0.0
    for n in names:
        g = lambda k: t[f"{n}.{k}"].float()
        l2 = lambda x: x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)
        f = g("f")[None]
        if n.startswith("bounded"):
            gg = gate.naive_kda_lowerbound_gate(f, g("A_log"), g("dt_bias"), lower_bound=-5.0)
        else:
            gg = gate.naive_kda_gate(f, g("A_log"), g("dt_bias"))
        assert rel_err(gg[0], g("g")) < 1e-6
        o, S = naive.naive_recurrent_kda(l2(g("q"))[None], l2(g("k"))[None], g("v")[None], gg,
                                         torch.sigmoid(g("b"))[None], initial_state=g("S0")[None],
                                         output_final_state=True)
        worst_o = max(worst_o, rel_err(o[0], g("o")))
        worst_S = max(worst_S, rel_err(S[0], g("S")))
    measure("golden ops/kda o vs fla naive gate + naive_recurrent_kda (fp32), worst case", worst_o, 1e-5)
    measure("golden ops/kda S vs fla naive gate + naive_recurrent_kda (fp32), worst case", worst_S, 1e-5)


def test_indexer_goldens_vs_fla(measure):
    dsa = pytest.importorskip("fla.ops.dsa.naive")
    t, names = _cases("indexer.safetensors")
    differ = 0
    for n in names:
        qI, kI, w = t[f"{n}.qI"].double(), t[f"{n}.kI"].double(), t[f"{n}.w"].double()
        sc, sel = t[f"{n}.scores"].double(), t[f"{n}.selected"].long()
        topk = sel.shape[1]
        ref = dsa.naive_dsa_indexer(qI[None], kI[None], w[None], topk=topk, scale=1.0, activation="relu")[0]
        for r in range(sel.shape[0]):
            a, b = sel[r][sel[r] >= 0].tolist(), ref[r][ref[r] >= 0].tolist()
            if set(a) != set(b):
                assert sorted(sc[r, a].tolist()) == sorted(sc[r, b].tolist()), (n, r)
                differ += 1
        T = qI.shape[0]
        mine = ops.indexer_scores(qI, kI, w, torch.arange(T))
        assert rel_err(mine[torch.isfinite(mine)], sc[torch.isfinite(sc)]) < 1e-6
    print(f"rows resolved differently from torch.topk among exact ties: {differ}")
    measure("golden ops/indexer selections vs fla naive_dsa_indexer (rows differing beyond ties)", 0.0, 0)


def test_sparse_mla_goldens_vs_fla(measure):
    dsa = pytest.importorskip("fla.ops.dsa.naive")
    t, names = _cases("sparse_mla.safetensors")
    meta = {c["name"]: c for c in json.loads((GOLD / "ops" / "index.json").read_text())["sparse_mla.safetensors"]}
    worst = 0.0
    for n in names:
        c = meta[n]
        Hm, nn_, r, vd, L = c["Hm"], c["qk_nope"], c["qk_rope"], c["v_head"], c["kv_lora_rank"]
        g = lambda k: t[f"{n}.{k}"].double()
        T = g("c").shape[0]
        W = g("kv_b_proj").view(Hm, nn_ + vd, L)
        K = torch.cat([torch.einsum("hnl,sl->shn", W[:, :nn_], g("c")), g("k_pe")[:, None].expand(T, Hm, r)], -1)
        V = torch.einsum("hvl,sl->shv", W[:, nn_:], g("c"))
        Q = torch.cat([g("q_nope"), g("q_pe")], -1)
        o = dsa.naive_dsa(Q[None].float(), K[None].float(), V[None].float(), None, None,
                          indices=t[f"{n}.selected"].long()[None], topk=c["topk"], scale=c["scale"])[0]
        worst = max(worst, rel_err(o, g("o")))
    measure("golden ops/sparse_mla o vs fla naive_dsa (fp32), worst case", worst, 1e-5)


def test_mxfp4_goldens_vs_transformers(measure):
    mx = pytest.importorskip("transformers.integrations.mxfp4")
    t = load_file(str(GOLD / "ops" / "mxfp4.safetensors"))
    for n in ("table", "random"):
        p, s = t[f"{n}.packed"], t[f"{n}.scale"]
        out, half = p.shape
        w = mx.convert_moe_packed_tensors(p.reshape(1, out, half // 16, 16), s.reshape(1, out, half // 16),
                                          dtype=torch.float32)[0].t()
        assert torch.equal(w, t[f"{n}.dequant"])
    measure("golden ops/mxfp4 dequant vs transformers convert_moe_packed_tensors (exact)", 0.0, 0)


def test_k31_tiny_checkpoint_layout():
    """The tiny checkpoint uses the docs/formats.md names (language_model. prefix) and dtypes."""
    f32_names = ("conv1d.weight", "A_log", "dt_bias", "e_score_correction_bias", "k_norm.weight", "k_norm.bias")
    with safe_open(str(GOLD / "k31_tiny" / "model" / "model.safetensors"), "pt") as f:
        for k in f.keys():
            assert k.startswith("language_model.model.") or k == "language_model.lm_head.weight", k
            dt = f.get_slice(k).get_dtype()
            if k.endswith(("weight_packed", "weight_scale")):
                assert dt == "U8", k
            elif k.endswith(f32_names):
                assert dt == "F32", k
            else:
                assert dt == "BF16", k
    cfg = json.loads((GOLD / "k31_tiny" / "model" / "config.json").read_text())
    assert cfg["architectures"] == ["KimiK31ForConditionalGeneration"] and "text_config" in cfg


def test_k31_tiny_golden_f32(measure):
    """k31ref in float32 reproduces the float64 golden logits; the golden incremental runs equal the full run."""
    out = load_file(str(GOLD / "k31_tiny" / "outputs.safetensors"))
    m = Model.load(GOLD / "k31_tiny" / "model", dtype=torch.float32)
    full = m.logits_full(out["input_ids"])
    measure("k31_tiny golden: k31ref f32 full logits vs f64 golden", rel_err(full, out["logits_full"]), 5e-5)
    measure("k31_tiny golden: incremental (prefill 20) vs full, both golden",
            rel_err(out["logits_incremental"], out["logits_full"]), 1e-6)
    measure("k31_tiny golden: decode-only vs full, both golden",
            rel_err(out["logits_decode_only"], out["logits_full"]), 1e-6)


@pytest.mark.skipif(os.environ.get("K31_SKIP_REGEN") == "1", reason="K31_SKIP_REGEN=1")
def test_goldens_regenerate_bit_identically():
    p = subprocess.run([sys.executable, str(REF_DIR / "make_goldens.py"), "--check"], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    print(p.stdout.strip().splitlines()[-1])
