"""The Kimi Linear variant, whole model, vs transformers' KimiLinearForCausalLM with identical weights."""
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from conftest import REF_DIR, rel_err
from k31ref import Model

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def hf_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("kimi_linear_hf")
    subprocess.run([sys.executable, str(REF_DIR / "hf_kimi_linear.py"), str(out)], check=True,
                   capture_output=True, text=True)
    return out


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_kimi_linear_logits(hf_run, dtype, measure):
    ref = load_file(str(hf_run / "hf_outputs.safetensors"))
    meta_prefill = 13
    m = Model.load(hf_run / "model", dtype=dtype)
    assert m.cfg.gate_lower_bound is None and not m.cfg.full_rank_gate and m.cfg.attn_res_block_size is None
    ids = ref["input_ids"]
    tag = "f64" if dtype == torch.float64 else "f32"
    full = m.logits_full(ids)
    measure(f"Kimi Linear full logits ({tag}) vs transformers full", rel_err(full, ref["logits_full"]), 1e-4)
    inc = m.logits_incremental(ids, meta_prefill)
    measure(f"Kimi Linear prefill13+decode ({tag}) vs transformers prefill13+decode",
            rel_err(inc, ref["logits_incremental"]), 1e-4)
    measure(f"Kimi Linear ours incremental vs ours full ({tag})", rel_err(inc, full), 1e-5 if tag == "f32" else 1e-12)
    toks, glog = m.greedy(ids, ref["greedy_tokens"].numel())
    assert toks == ref["greedy_tokens"].tolist()
    measure(f"Kimi Linear greedy-step logits ({tag}) vs transformers", rel_err(glog, ref["greedy_logits"]), 1e-4)
