"""How far the engine's logits are from the f64 reference once the reference stores its caches as
the engine does: the reference re-run with the MLA latent cache (c | k_pe) and / or the index-key
cache rounded to bf16, against the engine's logits of the same ids.

    k31 score --model ../../tests/golden/k31_tiny/model --token-ids IDS.json --dump-logits ENG.safetensors
    python cache_rounding.py ENG.safetensors [GOLDEN_DIR]      (from tools/reference)

IDS.json: the golden's `input_ids` as a JSON array. Prints, per rounding, the reference's distance to
the committed goldens (the unrounded f64 run) and the engine's distance to that reference.
"""
import json, struct, sys, types
from pathlib import Path

import torch

def st_load(path):
    f = open(path, 'rb').read()
    n = struct.unpack('<Q', f[:8])[0]
    h = json.loads(f[8:8 + n])
    dt = {'F32': torch.float32, 'BF16': torch.bfloat16, 'F16': torch.float16, 'I32': torch.int32, 'I64': torch.int64, 'U8': torch.uint8, 'F64': torch.float64}
    out = {}
    for k, v in h.items():
        if k == '__metadata__':
            continue
        a, b = v['data_offsets']
        buf = bytearray(f[8 + n + a:8 + n + b])
        t = torch.frombuffer(buf, dtype=dt[v['dtype']]) if b > a else torch.zeros(0, dtype=dt[v['dtype']])
        out[k] = t.reshape(v['shape']).clone()
    return out

try:
    import safetensors.torch  # noqa: F401
except ImportError:
    st = types.ModuleType('safetensors'); stt = types.ModuleType('safetensors.torch')
    stt.load_file = lambda p, device='cpu': st_load(str(p))
    stt.save_file = lambda *a, **k: None
    st.torch = stt; sys.modules['safetensors'] = st; sys.modules['safetensors.torch'] = stt

sys.path.insert(0, str(Path(__file__).resolve().parent))
import k31ref.model as M
from k31ref import Model

golden_dir = Path(sys.argv[2]) if len(sys.argv) > 2 else Path(__file__).resolve().parents[2] / 'tests/golden/k31_tiny'
gold = st_load(golden_dir / 'outputs.safetensors')
eng = st_load(sys.argv[1])['logits'].double()
ids = gold['input_ids'].long()
model = Model.load(golden_dir / 'model')
cfg = model.cfg

def rel(a, b):
    return float(((a - b).norm() / b.norm()))

orig = M._cat
for name, dims in [('none', ()), ('latent c|k_pe', (cfg.kv_lora_rank, cfg.qk_rope)), ('index keys', (cfg.index_head_dim,)), ('all caches', (cfg.kv_lora_rank, cfg.qk_rope, cfg.index_head_dim))]:
    def cat(a, b, dims=dims):
        if b.shape[-1] in dims:
            b = b.to(torch.bfloat16).to(b.dtype)
        return orig(a, b)
    M._cat = cat
    logits = model.forward(ids).double()
    print(f'{name:16s} ref vs golden {rel(logits, gold["logits_full"].double()):.3e}   engine vs ref {rel(eng, logits):.3e}', flush=True)
M._cat = orig
