// The decode-time cache rows of a global layer (global_prep.wgsl's workgroups 1 and 2, and
// global_q.wgsl's first two) and their bindings 3-9: the including module declares the params
// `p` (kv_width, kv_n, kv_row, k_n, k_row, eps, k_eps) and the workgroup size WG, and includes
// lib/wg_sum.wgsl and lib/bf16_bits.wgsl. Call from uniform control flow (wg_sum's barriers).

@group(0) @binding(3) var<storage, read> kv: array<f32>;
@group(0) @binding(4) var<storage, read> g_kv: array<f32>;
@group(0) @binding(5) var<storage, read_write> latent_page: array<u32>;
@group(0) @binding(6) var<storage, read> ki: array<f32>;
@group(0) @binding(7) var<storage, read> g_k: array<f32>;
@group(0) @binding(8) var<storage, read> b_k: array<f32>;
@group(0) @binding(9) var<storage, read_write> key_page: array<u32>;

// Element i of the latent row: normed below kv_n, raw (k_pe) above.
fn latent_value(i: u32, r: f32) -> f32 {
    let v = kv[i];
    return select(v, v * r * g_kv[min(i, p.kv_n - 1u)], i < p.kv_n);
}

// latent cache row = bf16(RMSNorm(kv[0..kv_n]; g_kv) | kv[kv_n..kv_width]).
fn latent_row(lid: u32) {
    var ss = 0.0;
    for (var i = lid; i < p.kv_n; i += WG) {
        ss += kv[i] * kv[i];
    }
    let r = inverseSqrt(wg_sum(lid, ss) / f32(p.kv_n) + p.eps);
    let words = p.kv_width / 2u;
    for (var w = lid; w < words; w += WG) {
        latent_page[p.kv_row * words + w] = bf16_bits(latent_value(2u * w, r)) | (bf16_bits(latent_value(2u * w + 1u, r)) << 16u);
    }
}

// index-key cache row = bf16(LayerNorm(ki; g_k, b_k)).
fn key_row(lid: u32) {
    var s = 0.0;
    for (var i = lid; i < p.k_n; i += WG) {
        s += ki[i];
    }
    let mean = wg_sum(lid, s) / f32(p.k_n);
    var ss = 0.0;
    for (var i = lid; i < p.k_n; i += WG) {
        let d = ki[i] - mean;
        ss += d * d;
    }
    let r = inverseSqrt(wg_sum(lid, ss) / f32(p.k_n) + p.k_eps);
    let words = p.k_n / 2u;
    for (var w = lid; w < words; w += WG) {
        let a = (ki[2u * w] - mean) * r * g_k[2u * w] + b_k[2u * w];
        let b = (ki[2u * w + 1u] - mean) * r * g_k[2u * w + 1u] + b_k[2u * w + 1u];
        key_page[p.k_row * words + w] = bf16_bits(a) | (bf16_bits(b) << 16u);
    }
}
