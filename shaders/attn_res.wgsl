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
// d-strided loads was latency-bound: ~36 us per call at d = 7168 on an H200; one workgroup
// per source still ~22 us):
//   attn_res_sums, grid (n * chunks, T), chunks = ceil(d / CHUNK): the sum of squares and
//     the dot with gamma * proj of one CHUNK of one source -> alpha[T*n + ((t*n + j)*chunks + c)*2 + {0,1}];
//   attn_res_mix, grid (ceil(d / WG), T): every workgroup adds the partial sums, takes the
//     softmax of the n logits and mixes its WG columns; workgroup 0 also writes alpha[t*n + j].
// alpha therefore holds T * n * (1 + 2 * chunks) floats (weights, then partial sums).

const CHUNK: u32 = 1024u;

fn chunks() -> u32 {
    return (p.d + CHUNK - 1u) / CHUNK;
}

@compute @workgroup_size(256)
fn attn_res_sums(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let n = p.n_bank + 1u;
    let nc = chunks();
    let j = wg.x / nc;
    let c = wg.x % nc;
    let t = wg.y;
    if (j >= n || t >= p.tokens) {
        return;
    }
    var v: array<f32, 4>;
    var w: array<f32, 4>;
    for (var k = 0u; k < CHUNK / WG; k++) {
        let i = c * CHUNK + k * WG + lid;
        let ic = min(i, p.d - 1u);
        v[k] = select(0.0, source(j, t, ic), i < p.d);
        w[k] = select(0.0, bf16_at(0u, ic) * bf16_at(1u, ic), i < p.d);
    }
    var ss = 0.0;
    var dq = 0.0;
    for (var k = 0u; k < CHUNK / WG; k++) {
        ss += v[k] * v[k];
        dq += v[k] * w[k];
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
        let at = p.tokens * n + ((t * n + j) * nc + c) * 2u;
        alpha[at] = red[0];
        alpha[at + 1u] = red[WG];
    }
}

@compute @workgroup_size(256)
fn attn_res_mix(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let t = wg.y;
    if (t >= p.tokens) {
        return;
    }
    let n = p.n_bank + 1u;
    let nc = chunks();
    // Logits from the partial sums: the workgroup loads them once into workgroup memory
    // instead of every thread walking n * chunks pairs in global memory (no measurable change
    // on the H200 at d = 7168), then every thread adds each source's chunks in a fixed
    // order. Host-checked: n * chunks <= WG.
    if (lid < n * nc) {
        let at = p.tokens * n + (t * n * nc + lid) * 2u;
        red[lid] = alpha[at];
        red[WG + lid] = alpha[at + 1u];
    }
    workgroupBarrier();
    var wj: array<f32, MAX_SOURCES>;
    var m = -3.40282347e38;
    for (var j = 0u; j < MAX_SOURCES; j++) {
        if (j < n) {
            var ss = 0.0;
            var dq = 0.0;
            for (var c = 0u; c < nc; c++) {
                ss += red[j * nc + c];
                dq += red[WG + j * nc + c];
            }
            wj[j] = dq * inverseSqrt(ss / f32(p.d) + p.eps);
            m = max(m, wj[j]);
        }
    }
    var sum = 0.0;
    for (var j = 0u; j < MAX_SOURCES; j++) {
        if (j < n) {
            wj[j] = exp(wj[j] - m);
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
    // One column per thread, every source load issued unconditionally (clamped index; the
    // select drops what is not a source without arithmetic on it, so stale or NaN data
    // cannot leak in): loads under `if (j < n)` were waited for one by one.
    let i = min(wg.x * WG + lid, p.d - 1u);
    let cur_v = cur[t * p.d + i];
    let last_bank = max(p.n_bank, 1u) - 1u;
    var acc = 0.0;
    for (var j = 0u; j < MAX_SOURCES; j++) {
        let v = select(cur_v, bank[min(j, last_bank) * p.bank_stride + t * p.d + i], j < p.n_bank);
        acc += select(0.0, wj[j] * v, j < n);
    }
    if (wg.x * WG + lid < p.d) {
        out[t * p.d + i] = acc;
    }
}
