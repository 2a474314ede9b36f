// Block AttnRes's shared part (attn_res.wgsl's portable passes and attn_res_sg.wgsl's subgroup
// ones): the parameters and bindings, the sources, the sums pass's per-thread share, the mix
// pass's partial totals and its columns. The layout of the partial sums and every formula:
// attn_res.wgsl's header.

struct AttnResParams {
    tokens: u32,
    d: u32,
    n_bank: u32,
    bank_stride: u32,
    eps: f32,
    add: u32,
    norm: u32,
    chunk: u32,
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

const WG: u32 = 256u;
const MAX_SOURCES: u32 = 16u;
var<workgroup> red: array<f32, 4352>; // sums: [2, WG]; mix: partials, then totals
// The softmax weights, then the mix's inverse RMS.
var<workgroup> weights: array<f32, 17>;
// Each source's term of the mix's mean square.
var<workgroup> hh_terms: array<f32, 16>;
// Columns per thread per step of the sums pass.
const COLS: u32 = 4u;
// Bank entries the mix pass loads up front (b0..b7).
const PREFETCH: u32 = 8u;

fn bf16_of(word: u32, i: u32) -> f32 {
    return bitcast<f32>(select(word << 16u, word & 0xffff0000u, (i & 1u) == 1u));
}

fn chunks() -> u32 {
    return (p.d + p.chunk - 1u) / p.chunk;
}

fn partials_per_chunk(n: u32) -> u32 {
    return n + n * (n + 1u) / 2u;
}

// The current partial of token t at column i (i < d).
fn current(t: u32, i: u32) -> f32 {
    let c = t * p.d + i;
    var v = cur[c];
    if (p.add != 0u) {
        v += addend[c];
    }
    return v;
}

// Source j of token t at column i given the current partial `cv` there: a clamped bank load
// (issued whatever j is) and a select.
fn source(j: u32, t: u32, i: u32, cv: f32) -> f32 {
    let b = bank[min(j, max(p.n_bank, 1u) - 1u) * p.bank_stride + t * p.d + i];
    return select(cv, b, j < p.n_bank);
}

// Gram entry q of the lower triangle as (j, k), k <= j.
fn pair(q: u32) -> vec2<u32> {
    var j = u32((sqrt(8.0 * f32(q) + 1.0) - 1.0) * 0.5);
    // Float rounding near perfect squares: step to the row that holds q.
    if (j * (j + 1u) / 2u > q) {
        j -= 1u;
    } else if ((j + 1u) * (j + 2u) / 2u <= q) {
        j += 1u;
    }
    return vec2<u32>(j, q - j * (j + 1u) / 2u);
}

// The sums pass's workgroup wg as (Gram pair q, chunk c, token t, live): live is 0 for a q past
// the pairs or a t past the tokens (nothing to do).
fn sums_slot(wg: vec3<u32>) -> vec4<u32> {
    let n = p.n_bank + 1u;
    let q = wg.x / chunks();
    return vec4<u32>(q, wg.x % chunks(), wg.y, select(0u, 1u, q < n * (n + 1u) / 2u && wg.y < p.tokens));
}

// This thread's share of workgroup (pair q, chunk c)'s sums for token t: over chunk c's columns,
// v_j . v_k (Gram pair q = (j, k)) and, on the diagonal, v_j . (gamma * proj), as (g, dq); the
// current partial also goes to `part` when `add` (the diagonal of the last source).
fn sums_share(q: u32, c: u32, t: u32, lid: u32) -> vec2<f32> {
    let n = p.n_bank + 1u;
    let jk = pair(q);
    let diagonal = jk.x == jk.y;
    // COLS columns per thread, all loads issued first (clamped; select drops the rest).
    var g = 0.0;
    var dq = 0.0;
    for (var i0 = c * p.chunk; i0 < min(p.d, (c + 1u) * p.chunk); i0 += WG * COLS) {
        var vj: array<f32, COLS>;
        var vk: array<f32, COLS>;
        // The pseudo-query's weights with the sources (every workgroup: L2 hits), so no load
        // waits behind the arithmetic.
        var gp: array<f32, COLS>;
        for (var u = 0u; u < COLS; u++) {
            let i = min(i0 + u * WG + lid, p.d - 1u);
            let cv = current(t, i);
            vj[u] = source(jk.x, t, i, cv);
            vk[u] = source(jk.y, t, i, cv);
            gp[u] = bf16_of(gamma[i >> 1u], i) * bf16_of(proj[i >> 1u], i);
        }
        for (var u = 0u; u < COLS; u++) {
            let i = i0 + u * WG + lid;
            let keep = i < min(p.d, (c + 1u) * p.chunk);
            g += select(0.0, vj[u] * vk[u], keep);
            if (diagonal) {
                dq += select(0.0, vj[u] * gp[u], keep);
                if (p.add != 0u && jk.x == n - 1u && keep) {
                    part[t * p.d + i] = vj[u];
                }
            }
        }
    }
    return vec2<f32>(g, dq);
}

// Where workgroup (q, c)'s totals of token t go.
fn store_sums(q: u32, c: u32, t: u32, g: f32, dq: f32) {
    let n = p.n_bank + 1u;
    let at = p.tokens * n + (t * chunks() + c) * partials_per_chunk(n);
    alpha[at + n + q] = g;
    let jk = pair(q);
    if (jk.x == jk.y) {
        alpha[at + jk.x] = dq;
    }
}

// The current partial and the first PREFETCH bank entries (clamped) of token t at column i,
// loaded before anything waits: their latency overlaps the partial sums' loads and the softmax.
struct Prefetched {
    cv: f32,
    b0: f32,
    b1: f32,
    b2: f32,
    b3: f32,
    b4: f32,
    b5: f32,
    b6: f32,
    b7: f32,
}

fn prefetch(t: u32, i: u32) -> Prefetched {
    let last = max(p.n_bank, 1u) - 1u;
    let row = t * p.d + i;
    return Prefetched(current(t, i), bank[min(0u, last) * p.bank_stride + row], bank[min(1u, last) * p.bank_stride + row],
        bank[min(2u, last) * p.bank_stride + row], bank[min(3u, last) * p.bank_stride + row], bank[min(4u, last) * p.bank_stride + row],
        bank[min(5u, last) * p.bank_stride + row], bank[min(6u, last) * p.bank_stride + row], bank[min(7u, last) * p.bank_stride + row]);
}

// Token t's partial sums into workgroup memory, then each total summed over the chunks in a
// fixed order (the same in every workgroup, so all of them mix with identical weights) at
// red[tot + m]; returns tot. `nt` threads; called from uniform control flow (two barriers).
fn partial_totals(t: u32, lid: u32, nt: u32) -> u32 {
    let n = p.n_bank + 1u;
    let nc = chunks();
    let np = partials_per_chunk(n);
    let base = p.tokens * n + t * nc * np;
    for (var q = lid; q < nc * np; q += nt) {
        red[q] = alpha[base + q];
    }
    workgroupBarrier();
    let tot = nc * np;
    for (var m = lid; m < np; m += nt) {
        var s = 0.0;
        for (var c = 0u; c < nc; c++) {
            s += red[c * np + m];
        }
        red[tot + m] = s;
    }
    workgroupBarrier();
    return tot;
}

// The mixed (and, with `norm`, normed) value at column i from its prefetched sources, the
// softmax weights in `weights` and the mix's inverse RMS `inv`.
fn mix_column(f: Prefetched, t: u32, i: u32, inv: f32) -> f32 {
    let n = p.n_bank + 1u;
    // Over the n sources only (uniform branches; a loop unrolled over MAX_SOURCES with
    // clamped loads and selects cost ~2.5 us per call on an H200).
    var acc = weights[n - 1u] * f.cv;
    if (p.n_bank > 0u) {
        acc += weights[0] * f.b0;
    }
    if (p.n_bank > 1u) {
        acc += weights[1] * f.b1;
    }
    if (p.n_bank > 2u) {
        acc += weights[2] * f.b2;
    }
    if (p.n_bank > 3u) {
        acc += weights[3] * f.b3;
    }
    if (p.n_bank > 4u) {
        acc += weights[4] * f.b4;
    }
    if (p.n_bank > 5u) {
        acc += weights[5] * f.b5;
    }
    if (p.n_bank > 6u) {
        acc += weights[6] * f.b6;
    }
    if (p.n_bank > 7u) {
        acc += weights[7] * f.b7;
    }
    let row = t * p.d + i;
    for (var j = PREFETCH; j < p.n_bank; j++) {
        acc += weights[j] * bank[j * p.bank_stride + row];
    }
    if (p.norm != 0u) {
        acc = acc * inv * bf16_of(norm_w[i >> 1u], i);
    }
    return acc;
}
