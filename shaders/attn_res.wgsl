// Block Attention Residuals aggregation (spec 3.1), one workgroup per token:
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
var<workgroup> weight: array<f32, MAX_SOURCES>;

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

@compute @workgroup_size(256)
fn attn_res(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let t = wg.x + wg.y * nwg.x;
    if (t >= p.tokens) {
        return;
    }
    let n = p.n_bank + 1u;
    for (var j = 0u; j < n; j++) {
        var ss = 0.0;
        var dq = 0.0;
        for (var i = lid; i < p.d; i += WG) {
            let v = source(j, t, i);
            ss += v * v;
            dq += v * (bf16_at(0u, i) * bf16_at(1u, i));
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
            weight[j] = red[WG] * inverseSqrt(red[0] / f32(p.d) + p.eps);
        }
        workgroupBarrier();
    }
    if (lid == 0u) {
        var m = weight[0];
        for (var j = 1u; j < n; j++) {
            m = max(m, weight[j]);
        }
        var sum = 0.0;
        for (var j = 0u; j < n; j++) {
            let e = exp(weight[j] - m);
            weight[j] = e;
            sum += e;
        }
        for (var j = 0u; j < n; j++) {
            weight[j] = weight[j] / sum;
            alpha[t * n + j] = weight[j];
        }
    }
    workgroupBarrier();
    for (var i = lid; i < p.d; i += WG) {
        var acc = 0.0;
        for (var j = 0u; j < n; j++) {
            acc += weight[j] * source(j, t, i);
        }
        out[t * p.d + i] = acc;
    }
}
