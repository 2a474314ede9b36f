// Block Attention Residuals aggregation (spec 3.1):
//   sources v_j: bank entries j < n_bank (bank[j, t, :]) then the current partial `cur[t, :]`
//   s_j = (v_j . (gamma * proj)) * rsqrt(mean(v_j^2) + eps);  alpha = softmax(s)
//   out[t, :] = sum_j alpha_j v_j;  alpha[t, j] is written too.
// Preconditions (host-checked): n_bank + 1 <= MAX_SOURCES; bank holds n_bank entries of
// bank_stride f32 (>= tokens * d); cur and out hold tokens * d f32; gamma, proj hold d bf16.

struct AttnResParams {
    tokens: u32,
    d: u32,
    n_bank: u32,
    bank_stride: u32,
    eps: f32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: AttnResParams;
@group(0) @binding(1) var<storage, read> bank: array<f32>;
@group(0) @binding(2) var<storage, read> cur: array<f32>;
@group(0) @binding(3) var<storage, read> gamma: array<u32>;
@group(0) @binding(4) var<storage, read> proj: array<u32>;
@group(0) @binding(5) var<storage, read_write> out: array<f32>;
@group(0) @binding(6) var<storage, read_write> alpha: array<f32>;

const WG: u32 = 256u;
const MAX_SOURCES: u32 = 16u;
var<workgroup> red: array<f32, 512>; // [2, WG]

fn bf16_at(buf: u32, i: u32) -> f32 {
    var word: u32;
    if (buf == 0u) {
        word = gamma[i >> 1u];
    } else {
        word = proj[i >> 1u];
    }
    return bitcast<f32>(select(word << 16u, word & 0xffff0000u, (i & 1u) == 1u));
}

fn source(j: u32, t: u32, i: u32) -> f32 {
    if (j < p.n_bank) {
        return bank[j * p.bank_stride + t * p.d + i];
    }
    return cur[t * p.d + i];
}

// Two passes, both wide (one workgroup per token with a serial loop over the sources and
// d-strided loads was latency-bound: ~36 us per call at d = 7168 on an H200):
//   attn_res_logits, grid (n, T): raw logit s_j of one (source, token) -> alpha[T*n + t*n + j];
//   attn_res_mix, grid (ceil(d / CHUNK), T): every workgroup takes the softmax of the n logits
//   and mixes its CHUNK columns; chunk 0 also writes alpha[t*n + j].
// alpha therefore holds 2 * T * n floats (softmax weights, then raw logits).

const CHUNK: u32 = 1024u;
// Loads each thread keeps in flight per step of the logit pass.
const UNROLL: u32 = 8u;

@compute @workgroup_size(256)
fn attn_res_logits(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let j = wg.x;
    let t = wg.y;
    let n = p.n_bank + 1u;
    if (j >= n || t >= p.tokens) {
        return;
    }
    var ss = 0.0;
    var dq = 0.0;
    for (var i0 = 0u; i0 < p.d; i0 += WG * UNROLL) {
        var v: array<f32, UNROLL>;
        var c: array<f32, UNROLL>;
        for (var k = 0u; k < UNROLL; k++) {
            let i = i0 + k * WG + lid;
            if (i < p.d) {
                v[k] = source(j, t, i);
                c[k] = bf16_at(0u, i) * bf16_at(1u, i);
            }
        }
        for (var k = 0u; k < UNROLL; k++) {
            ss += v[k] * v[k];
            dq += v[k] * c[k];
        }
    }
    red[lid] = ss;
    red[WG + lid] = dq;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s >> 1u) {
        if (lid < s) {
            red[lid] += red[lid + s];
            red[WG + lid] += red[WG + lid + s];
        }
        workgroupBarrier();
    }
    if (lid == 0u) {
        alpha[p.tokens * n + t * n + j] = red[WG] * inverseSqrt(red[0] / f32(p.d) + p.eps);
    }
}

@compute @workgroup_size(256)
fn attn_res_mix(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let t = wg.y;
    if (t >= p.tokens) {
        return;
    }
    let n = p.n_bank + 1u;
    let raw = p.tokens * n + t * n;
    var wj: array<f32, MAX_SOURCES>;
    var m = alpha[raw];
    for (var j = 1u; j < MAX_SOURCES; j++) {
        if (j < n) {
            m = max(m, alpha[raw + j]);
        }
    }
    var sum = 0.0;
    for (var j = 0u; j < MAX_SOURCES; j++) {
        if (j < n) {
            wj[j] = exp(alpha[raw + j] - m);
            sum += wj[j];
        }
    }
    for (var j = 0u; j < MAX_SOURCES; j++) {
        wj[j] = wj[j] / sum;
    }
    if (wg.x == 0u && lid < n) {
        // Same arithmetic as every workgroup's weights, so alpha is exactly what was mixed.
        var e = 0.0;
        for (var j = 0u; j < MAX_SOURCES; j++) {
            if (j == lid) {
                e = wj[j];
            }
        }
        alpha[t * n + lid] = e;
    }
    for (var k = 0u; k < CHUNK / WG; k++) {
        let i = wg.x * CHUNK + k * WG + lid;
        if (i < p.d) {
            var acc = 0.0;
            for (var j = 0u; j < MAX_SOURCES; j++) {
                if (j < n) {
                    acc += wj[j] * source(j, t, i);
                }
            }
            out[t * p.d + i] = acc;
        }
    }
}
