// Batched linear layer for prefill on cooperative matrices (16x16x16 f16 x f16 -> f32, tensor
// cores): the same contract as linear.wgsl (its SIMT twin), bf16 W only, cols a multiple of 8,
// subgroups of 32 (host-checked):
//   y[t, row_offset + r] (+)= sum_c W[r, c] x[t, c].
//
// Precision (held to the SIMT path's tolerance against an f64 reference):
// - Activations: x[t, :] is scaled by a power of two s_t that puts the token's largest |x| into
//   [2^13, 2^14) (no f16 overflow however large x is), then split into hi = x*s_t with its low
//   13 mantissa bits masked off (11 significant bits: exact in f16; masking rather than
//   f16(x - f32(f16(x))), which the driver folds to x, as dsa_index_coop.wgsl found) and
//   lo = f16(x*s_t - hi): 22 significant bits of every x, two MMAs per fragment. The epilogue
//   multiplies by 1 / s_t. s_t comes from linear_scale, a pre-pass over x (one read of x,
//   about 1 % of the GEMM): a per-tile scale would need every workgroup to scan its tokens'
//   whole rows before its first MMA, rows / 128 reads of x instead of one.
// - Weights: bf16 -> f16 is exact for 2^-17 <= |w| < 2^16 and for 0. Smaller weights round to
//   the f16 subnormal grid (absolute error <= 2^-25 per weight, below 1e-6 of the output for
//   any row whose weights are not all that small); |w| >= 2^16 (or inf/NaN) would overflow:
//   the workgroup notices while staging and computes its whole tile in f32 instead (slow,
//   never seen in real checkpoints).
//
// Tiling: a workgroup of 8 subgroups computes BM = 128 tokens x BN = 128 rows; subgroup sg owns
// tokens 64 (sg / 4) .. +63 and rows 32 (sg % 4) .. +31 (4 x 2 accumulator fragments). K
// advances in steps of BK = 16 through two workgroup buffers, the next step's slab fetched
// into registers (16-byte loads) while the current one is multiplied, as in linear.wgsl
// (thread n = lid % 128, h = lid / 128 fetches k h*8..+7 of W row n and of token n).
// Staged rows are 48 bytes apart (16 f16 + 8 pad) so fragment loads hit distinct banks. The
// epilogue stores each fragment to workgroup memory and applies 1/s, row_offset, y_stride,
// accumulate and the bounds. 45 KiB of workgroup memory (NVIDIA allows 48).

enable f16;
enable wgpu_cooperative_matrix;

#include "lib/linear_params.wgsl"
@group(0) @binding(1) var<storage, read> w: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
// Per token: s_t and 1 / s_t (linear_scale writes, linear_coop reads).
@group(0) @binding(4) var<storage, read_write> sc: array<f32>;
#include "lib/store_y.wgsl"

const BN: u32 = 128u;
const BM: u32 = 128u;
const BK: u32 = 16u;
const SS: u32 = 6u;          // vec4<f16> stride of a staged row
const STAGE: u32 = 768u;     // vec4<f16> per buffer: 128 rows x SS

var<workgroup> wt: array<vec4<f16>, 1536>; // [buffer][row n][k] f16(W)
var<workgroup> xh: array<vec4<f16>, 1536>; // [buffer][token][k] hi part of x * s
var<workgroup> xl: array<vec4<f16>, 1536>; // [buffer][token][k] lo part
var<workgroup> cs: array<f32, 2048>;       // 8 subgroups x one 16 x 16 fragment (row-major)
var<workgroup> red: atomic<u32>;           // linear_scale: max |x| as f32 bits
var<workgroup> bad: atomic<u32>;           // a weight of this tile is outside f16's range
var<workgroup> bad_all: u32;

fn bf_lo(v: u32) -> f32 {
    return bitcast<f32>(v << 16u);
}

fn bf_hi(v: u32) -> f32 {
    return bitcast<f32>(v & 0xffff0000u);
}

fn max4(v: vec4<f32>) -> f32 {
    return max(max(v.x, v.y), max(v.z, v.w));
}

// One workgroup per token: s_t = 2^e with max |x[t, :]| s_t in [2^13, 2^14).
@compute @workgroup_size(256)
fn linear_scale(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let t = wg.x + wg.y * nwg.x;
    if (t >= p.tokens) {
        return;
    }
    let n4 = p.cols / 4u;
    var m = 0.0;
    for (var i = lid; i < n4; i += 256u) {
        m = max(m, max4(abs(x[t * n4 + i])));
    }
    atomicMax(&red, bitcast<u32>(m));
    workgroupBarrier();
    if (lid == 0u) {
        let mb = atomicLoad(&red);
        var e = 0i;
        if (mb != 0u) {
            e = clamp(13i - (i32((mb >> 23u) & 0xffu) - 127i), -126i, 126i);
        }
        sc[2u * t] = ldexp(1.0, e);
        sc[2u * t + 1u] = ldexp(1.0, -e);
    }
}

// W[row, k..k+8] as 8 bf16; 0 past cols (cols % 8 == 0: all 8 in or all out).
fn fetch_w(row: u32, k: u32) -> vec4<u32> {
    if (k >= p.cols) {
        return vec4<u32>(0u);
    }
    return w[(row * p.cols + k) / 8u];
}

fn fetch_x(t: u32, k: u32, part: u32) -> vec4<f32> {
    if (k >= p.cols) {
        return vec4<f32>(0.0);
    }
    return x[(t * p.cols + k) / 4u + part];
}

fn split(v: vec4<f32>, at: u32) {
    let hi = bitcast<vec4<f32>>(bitcast<vec4<u32>>(v) & vec4<u32>(0xffffe000u));
    xh[at] = vec4<f16>(hi);
    xl[at] = vec4<f16>(v - hi);
}

fn stage(buf: u32, n: u32, h: u32, fw: vec4<u32>, xa: vec4<f32>, xb: vec4<f32>, s: f32) {
    let at = buf * STAGE + n * SS + h * 2u;
    let w0 = vec4<f32>(bf_lo(fw.x), bf_hi(fw.x), bf_lo(fw.y), bf_hi(fw.y));
    let w1 = vec4<f32>(bf_lo(fw.z), bf_hi(fw.z), bf_lo(fw.w), bf_hi(fw.w));
    // Negated so that NaN counts as out of range too.
    if (!(max(max4(abs(w0)), max4(abs(w1))) < 65536.0)) {
        atomicOr(&bad, 1u);
    }
    wt[at] = vec4<f16>(w0);
    wt[at + 1u] = vec4<f16>(w1);
    split(xa * s, at);
    split(xb * s, at + 1u);
}

// One accumulator fragment (tokens t..t+15, rows r..r+15) through the subgroup's slice of cs:
// lane l writes token t + l / 2, rows r + 8 (l % 2) .. +7.
fn emit(c: coop_mat16x16<f32, C>, t: u32, r: u32, sg: u32, lane: u32) {
    coopStoreT(c, &cs[sg * 256u], 16u);
    workgroupBarrier();
    let tt = t + lane / 2u;
    let rr = r + (lane % 2u) * 8u;
    if (tt < p.tokens) {
        let inv = sc[2u * tt + 1u];
        let base = tt * p.y_stride + p.row_offset;
        let at = sg * 256u + (lane / 2u) * 16u + (lane % 2u) * 8u;
        for (var i = 0u; i < 8u; i++) {
            if (rr + i < p.rows) {
                store_y(base + rr + i, cs[at + i] * inv);
            }
        }
    }
    workgroupBarrier();
}

// The tile in f32 from global memory (weights beyond f16's range; see the header).
fn exact_tile(r0: u32, t0: u32, lid: u32) {
    for (var e = lid; e < BM * BN; e += 256u) {
        let t = t0 + e / BN;
        let r = r0 + e % BN;
        if (t < p.tokens && r < p.rows) {
            var acc = 0.0;
            for (var k = 0u; k < p.cols; k += 8u) {
                let v = w[(r * p.cols + k) / 8u];
                let i = (t * p.cols + k) / 4u;
                acc += dot(x[i], vec4<f32>(bf_lo(v.x), bf_hi(v.x), bf_lo(v.y), bf_hi(v.y)));
                acc += dot(x[i + 1u], vec4<f32>(bf_lo(v.z), bf_hi(v.z), bf_lo(v.w), bf_hi(v.w)));
            }
            store_y(t * p.y_stride + p.row_offset + r, acc);
        }
    }
}

@compute @workgroup_size(256)
fn linear_coop(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
    @builtin(subgroup_id) sg: u32,
    @builtin(subgroup_invocation_id) lane: u32,
) {
    let r0 = wg.x * BN;
    let t0 = wg.y * BM;
    let n = lid % 128u;
    let h = lid / 128u;
    let wrow = min(r0 + n, p.rows - 1u);
    let xtok = min(t0 + n, p.tokens - 1u);
    let s = sc[2u * xtok];
    let steps = (p.cols + BK - 1u) / BK;
    stage(0u, n, h, fetch_w(wrow, h * 8u), fetch_x(xtok, h * 8u, 0u), fetch_x(xtok, h * 8u, 1u), s);
    workgroupBarrier();
    // Subgroup-uniform fragment origins.
    let mg = sg / 4u;
    let ng = sg % 4u;
    var c00 = coop_mat16x16<f32, C>();
    var c01 = coop_mat16x16<f32, C>();
    var c10 = coop_mat16x16<f32, C>();
    var c11 = coop_mat16x16<f32, C>();
    var c20 = coop_mat16x16<f32, C>();
    var c21 = coop_mat16x16<f32, C>();
    var c30 = coop_mat16x16<f32, C>();
    var c31 = coop_mat16x16<f32, C>();
    for (var st = 0u; st < steps; st++) {
        let buf = st & 1u;
        let more = st + 1u < steps;
        var fw = vec4<u32>(0u);
        var xa = vec4<f32>(0.0);
        var xb = vec4<f32>(0.0);
        if (more) {
            let k = (st + 1u) * BK + h * 8u;
            fw = fetch_w(wrow, k);
            xa = fetch_x(xtok, k, 0u);
            xb = fetch_x(xtok, k, 1u);
        }
        let wo = buf * STAGE + ng * 32u * SS;
        let xo = buf * STAGE + mg * 64u * SS;
        let b0 = coopLoad<coop_mat16x16<f16, B>>(&wt[wo], SS);
        let b1 = coopLoad<coop_mat16x16<f16, B>>(&wt[wo + 16u * SS], SS);
        let ah0 = coopLoadT<coop_mat16x16<f16, A>>(&xh[xo + 0u * SS], SS);
        c00 = coopMultiplyAdd(ah0, b0, c00);
        c01 = coopMultiplyAdd(ah0, b1, c01);
        let al0 = coopLoadT<coop_mat16x16<f16, A>>(&xl[xo + 0u * SS], SS);
        c00 = coopMultiplyAdd(al0, b0, c00);
        c01 = coopMultiplyAdd(al0, b1, c01);
        let ah1 = coopLoadT<coop_mat16x16<f16, A>>(&xh[xo + 16u * SS], SS);
        c10 = coopMultiplyAdd(ah1, b0, c10);
        c11 = coopMultiplyAdd(ah1, b1, c11);
        let al1 = coopLoadT<coop_mat16x16<f16, A>>(&xl[xo + 16u * SS], SS);
        c10 = coopMultiplyAdd(al1, b0, c10);
        c11 = coopMultiplyAdd(al1, b1, c11);
        let ah2 = coopLoadT<coop_mat16x16<f16, A>>(&xh[xo + 32u * SS], SS);
        c20 = coopMultiplyAdd(ah2, b0, c20);
        c21 = coopMultiplyAdd(ah2, b1, c21);
        let al2 = coopLoadT<coop_mat16x16<f16, A>>(&xl[xo + 32u * SS], SS);
        c20 = coopMultiplyAdd(al2, b0, c20);
        c21 = coopMultiplyAdd(al2, b1, c21);
        let ah3 = coopLoadT<coop_mat16x16<f16, A>>(&xh[xo + 48u * SS], SS);
        c30 = coopMultiplyAdd(ah3, b0, c30);
        c31 = coopMultiplyAdd(ah3, b1, c31);
        let al3 = coopLoadT<coop_mat16x16<f16, A>>(&xl[xo + 48u * SS], SS);
        c30 = coopMultiplyAdd(al3, b0, c30);
        c31 = coopMultiplyAdd(al3, b1, c31);
        if (more) {
            stage(1u - buf, n, h, fw, xa, xb, s);
        }
        workgroupBarrier();
    }
    if (lid == 0u) {
        bad_all = atomicLoad(&bad);
    }
    if (workgroupUniformLoad(&bad_all) != 0u) {
        exact_tile(r0, t0, lid);
        return;
    }
    emit(c00, t0 + mg * 64u + 0u, r0 + ng * 32u + 0u, sg, lane);
    emit(c01, t0 + mg * 64u + 0u, r0 + ng * 32u + 16u, sg, lane);
    emit(c10, t0 + mg * 64u + 16u, r0 + ng * 32u + 0u, sg, lane);
    emit(c11, t0 + mg * 64u + 16u, r0 + ng * 32u + 16u, sg, lane);
    emit(c20, t0 + mg * 64u + 32u, r0 + ng * 32u + 0u, sg, lane);
    emit(c21, t0 + mg * 64u + 32u, r0 + ng * 32u + 16u, sg, lane);
    emit(c30, t0 + mg * 64u + 48u, r0 + ng * 32u + 0u, sg, lane);
    emit(c31, t0 + mg * 64u + 48u, r0 + ng * 32u + 16u, sg, lane);
}
