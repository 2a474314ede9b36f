// Block Attention Residuals aggregation (spec 3.1), fused with the RMSNorm that follows it:
//   sources v_j: bank entries j < n_bank (bank[j, t, :]) then the current partial c[t, :],
//     c = cur, or c = cur + addend (the residual sum, also written to `part`) when `add`;
//   s_j = (v_j . (gamma * proj)) * rsqrt(mean(v_j^2) + eps);  alpha = softmax(s)
//   h[t, :] = sum_j alpha_j v_j;  out = RMSNorm(h; norm_w, eps) when `norm`, else out = h;
//   alpha[t, j] is written too.
// With n_bank = 0 this is RMSNorm(cur + addend) (alpha = 1): the plain-residual models' add
// and norm in one pass.
// Preconditions (host-checked): n_bank + 1 <= MAX_SOURCES; bank holds n_bank entries of
// bank_stride f32 (>= tokens * d); cur, addend, part and out hold tokens * d f32; gamma, proj,
// norm_w hold d bf16. Where `add` is off, addend may alias cur and part is a dummy.

struct AttnResParams {
    tokens: u32,
    d: u32,
    n_bank: u32,
    bank_stride: u32,
    eps: f32,
    add: u32,
    norm: u32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: AttnResParams;
@group(0) @binding(1) var<storage, read> bank: array<f32>;
@group(0) @binding(2) var<storage, read> cur: array<f32>;
@group(0) @binding(3) var<storage, read> gamma: array<u32>;
@group(0) @binding(4) var<storage, read> proj: array<u32>;
@group(0) @binding(5) var<storage, read_write> out: array<f32>;
@group(0) @binding(6) var<storage, read_write> alpha: array<f32>;
@group(0) @binding(7) var<storage, read> addend: array<f32>;
@group(0) @binding(8) var<storage, read_write> part: array<f32>;
@group(0) @binding(9) var<storage, read> norm_w: array<u32>;

// One workgroup per token does everything (decode is one token: the three dependent passes
// this replaces, logits / mix / norm, cost ~37 us on an H200 at d = 7168, mostly launch and
// drain). Phase 1 gives each source a segment of SEG threads, so every sum is reduced inside
// its segment; the mix gives each thread columns lid, lid + WG, ... .
const WG: u32 = 1024u;
const MAX_SOURCES: u32 = 16u;
const SEG: u32 = WG / MAX_SOURCES;
// Loads each phase-1 thread keeps in flight.
const UNROLL: u32 = 8u;
var<workgroup> red: array<f32, 2048>; // [2, WG]
var<workgroup> weights: array<f32, MAX_SOURCES>;

fn bf16_of(word: u32, i: u32) -> f32 {
    return bitcast<f32>(select(word << 16u, word & 0xffff0000u, (i & 1u) == 1u));
}

fn query_at(i: u32) -> f32 {
    return bf16_of(gamma[i >> 1u], i) * bf16_of(proj[i >> 1u], i);
}

// The current partial c at flat index k (the residual sum when `add`).
fn current(k: u32) -> f32 {
    var v = cur[k];
    if (p.add != 0u) {
        v += addend[k];
    }
    return v;
}

fn source(j: u32, t: u32, i: u32) -> f32 {
    if (j < p.n_bank) {
        return bank[j * p.bank_stride + t * p.d + i];
    }
    return current(t * p.d + i);
}

@compute @workgroup_size(1024)
fn attn_res_norm(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let t = wg.y * nwg.x + wg.x;
    if (t >= p.tokens) {
        return;
    }
    let n = p.n_bank + 1u;
    let d = p.d;

    // Phase 1: segment j sums v_j^2 and v_j . (gamma * proj); loads clamped and issued
    // unconditionally, out-of-range values dropped by select.
    let j = lid / SEG;
    let r = lid % SEG;
    var ss = 0.0;
    var dq = 0.0;
    if (j < n) {
        for (var i0 = r; i0 < d; i0 += SEG * UNROLL) {
            var v: array<f32, UNROLL>;
            var w: array<f32, UNROLL>;
            for (var k = 0u; k < UNROLL; k++) {
                let i = min(i0 + k * SEG, d - 1u);
                v[k] = source(j, t, i);
                w[k] = query_at(i);
            }
            for (var k = 0u; k < UNROLL; k++) {
                let keep = i0 + k * SEG < d;
                ss += select(0.0, v[k] * v[k], keep);
                dq += select(0.0, v[k] * w[k], keep);
            }
        }
    }
    red[lid] = ss;
    red[WG + lid] = dq;
    workgroupBarrier();
    for (var s = SEG / 2u; s > 0u; s = s >> 1u) {
        if (r < s) {
            red[lid] += red[lid + s];
            red[WG + lid] += red[WG + lid + s];
        }
        workgroupBarrier();
    }
    // Softmax over the n logits (segment heads hold the sums), one thread.
    if (lid == 0u) {
        var m = -3.40282347e38;
        for (var i = 0u; i < n; i++) {
            let s = red[WG + i * SEG] * inverseSqrt(red[i * SEG] / f32(d) + p.eps);
            weights[i] = s;
            m = max(m, s);
        }
        var sum = 0.0;
        for (var i = 0u; i < n; i++) {
            weights[i] = exp(weights[i] - m);
            sum += weights[i];
        }
        for (var i = 0u; i < n; i++) {
            weights[i] = weights[i] / sum;
            alpha[t * n + i] = weights[i];
        }
    }
    workgroupBarrier();

    // Phase 2: mix one column per thread per step, every source load issued unconditionally
    // (clamped bank index; select drops what is not a source).
    var wj: array<f32, MAX_SOURCES>;
    for (var i = 0u; i < MAX_SOURCES; i++) {
        wj[i] = select(0.0, weights[min(i, n - 1u)], i < n);
    }
    let last_bank = max(p.n_bank, 1u) - 1u;
    var hs = 0.0;
    for (var i = lid; i < d; i += WG) {
        let c = current(t * d + i);
        if (p.add != 0u) {
            part[t * d + i] = c;
        }
        var acc = 0.0;
        for (var b = 0u; b < MAX_SOURCES; b++) {
            let v = select(c, bank[min(b, last_bank) * p.bank_stride + t * d + i], b < p.n_bank);
            acc += select(0.0, wj[b] * v, b < n);
        }
        out[t * d + i] = acc;
        hs += acc * acc;
    }
    if (p.norm == 0u) {
        return;
    }

    // Phase 3: RMSNorm of the mix; each thread rescales the columns it wrote.
    red[lid] = hs;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s >> 1u) {
        if (lid < s) {
            red[lid] += red[lid + s];
        }
        workgroupBarrier();
    }
    let inv = inverseSqrt(red[0] / f32(d) + p.eps);
    for (var i = lid; i < d; i += WG) {
        out[t * d + i] = out[t * d + i] * inv * bf16_of(norm_w[i >> 1u], i);
    }
}
