"""fla's Triton KDA kernels at one K3.1 layer's shape, for benches/kda.rs's side-by-side rows.

chunk_kda: T = 8192, 96 heads x 128, bf16, the K3 call (bounded gate in kernel, l2 norm and
beta sigmoid in kernel, safe_gate). fused_recurrent_kda: one decode token, f32 state, over 16
distinct states (like benches/kda.rs) so the state streams from memory. Plus the CUDA copy
and matmul ceilings on the same GPU. CUDA events, median. Prints JSON.
Run on the GPU machine with the fla wheels on PYTHONPATH: python3 benches/kda_fla.py [out.json]
"""
import json
import sys

import torch
from fla.ops.kda import chunk_kda, fused_recurrent_kda


def median_ms(fn, reps=20, warmup=3):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def main():
    dev = "cuda"
    torch.manual_seed(0)
    out = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__}
    # Ceilings.
    n = 1 << 28  # 1 GiB of f32
    src = torch.empty(n, device=dev)
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src))
    out["torch_copy_gbs"] = 2 * n * 4 / ms / 1e6
    del src, dst
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    ms = median_ms(lambda: a @ a, reps=10)
    out["torch_bf16_matmul_tflops"] = 2 * 8192**3 / ms / 1e9
    torch.backends.cuda.matmul.allow_tf32 = False
    af = a.float()
    ms = median_ms(lambda: af @ af, reps=5)
    out["torch_f32_matmul_tflops"] = 2 * 8192**3 / ms / 1e9
    del a, af

    B, T, H, K = 1, 8192, 96, 128
    bf = torch.bfloat16
    q = torch.randn(B, T, H, K, device=dev, dtype=bf)
    k = torch.randn(B, T, H, K, device=dev, dtype=bf)
    v = torch.randn(B, T, H, K, device=dev, dtype=bf)
    g = torch.randn(B, T, H, K, device=dev, dtype=bf)
    beta = torch.randn(B, T, H, device=dev, dtype=bf)
    A_log = torch.log(torch.empty(H, device=dev).uniform_(1, 16))
    dt_bias = torch.empty(H * K, device=dev).uniform_(-2, 0)
    s0 = torch.zeros(B, H, K, K, device=dev, dtype=torch.float32)

    def chunk():
        return chunk_kda(q, k, v, g, beta, A_log=A_log, dt_bias=dt_bias, initial_state=s0, output_final_state=True,
                         use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                         safe_gate=True, lower_bound=-5.0)

    out["fla_chunk_kda_T8192_ms"] = median_ms(chunk, reps=10)

    layers = 16
    states = [torch.randn(B, H, K, K, device=dev, dtype=torch.float32) * 0.1 for _ in range(layers)]
    q1, k1, v1, g1, b1 = (x[:, :1].contiguous() for x in (q, k, v, g, beta))

    def decode():
        for s in states:
            fused_recurrent_kda(q1, k1, v1, g1, b1, A_log=A_log, dt_bias=dt_bias, initial_state=s,
                                output_final_state=True, use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                                use_beta_sigmoid_in_kernel=True, lower_bound=-5.0)

    us = median_ms(decode) * 1e3 / layers
    out["fla_fused_recurrent_kda_decode_us"] = us
    out["fla_fused_recurrent_kda_state_gbs"] = 2 * H * K * K * 4 / (us * 1e-6) / 1e9
    text = json.dumps(out, indent=1)
    print(text)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
