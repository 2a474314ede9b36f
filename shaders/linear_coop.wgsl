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
//   the f16 subnormal grid (absolute error <= 2^-25 per weight: negligible unless a row's
//   weights are all that small); |w| >= 2^16 (or inf/NaN) would overflow: the workgroup
//   notices while staging and computes its whole tile in f32 instead (slow, never expected
//   in real checkpoints).
// - Accumulation: the tensor cores' f32 accumulator truncates each MMA's sum, so one
//   accumulator over all of K erred ~2.4e-9 * cols (8e-5 relative L2 at cols = 33792). The
//   fragments are drained into f32 registers every DRAIN steps (1024 k): ~2.7e-6 at every
//   K3.1 shape on the H200, the SIMT kernel's 1-3e-6 (every 256 k: ~8e-7, but 9-13 % slower).
//   The host still runs this kernel only up to COOP_MAX_COLS (engine/src/ops/linear.rs).
//
// Tiling: a workgroup of 8 subgroups computes BM = 128 tokens x BN = 128 rows; subgroup sg owns
// tokens 64 (sg / 4) .. +63 and rows 32 (sg % 4) .. +31 (4 x 2 accumulator fragments).
// K advances in steps of BK = 32 through one workgroup buffer, the next step's slab fetched
// into registers (16-byte loads) while the current one is multiplied (measured on the H200:
// 41-63 TFLOP/s, vs 34-51 for BK = 16 through two buffers); thread n = lid % 128,
// h = lid / 128 fetches k h*KPT.. of W row n and of token n. Staged rows are 80 bytes apart
// (32 f16 + 8 pad) so fragment loads hit distinct banks (at BK = 16, unpadded 32-byte rows
// measured 2-14 % slower than padded 48-byte ones). The epilogue stores each fragment to
// workgroup memory and applies 1/s, row_offset, y_stride, accumulate and the bounds.
// Every workgroup variable is a multiple of 16 bytes, so the fragment pointers stay 16-byte
// aligned whatever order the driver lays them out in (with three 4-byte flags among them the
// H200 gave relative errors of 0.5; padding them to 16 bytes made every k exact).
// 38960 bytes of workgroup memory (NVIDIA allows 48 KiB).

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
const BK: u32 = 32u;
const KPT: u32 = 16u;      // k per thread per step
const SS: u32 = 10u;        // vec4<f16> stride of a staged row
const STAGE: u32 = 1280u;  // vec4<f16> per buffer: 128 rows x SS
// K steps per drain of the accumulators into f32 (32 x BK = 1024 k).
const DRAIN: u32 = 32u;

var<workgroup> wt: array<vec4<f16>, 1280>; // [buffer][row n][k] f16(W)
var<workgroup> xh: array<vec4<f16>, 1280>; // [buffer][token][k] hi part of x * s
var<workgroup> xl: array<vec4<f16>, 1280>; // [buffer][token][k] lo part
var<workgroup> cs: array<f32, 2048>;       // 8 subgroups x one 16 x 16 fragment (row-major)
// f32 sums of the drained fragments: lane l's 8 values (token l / 2, rows 8 (l % 2) ..) of
// each of the subgroup's 8 fragments.
var<private> fl: array<vec4<f32>, 16>;
var<workgroup> red: array<atomic<u32>, 4>; // linear_scale: [0] = max |x| as f32 bits
var<workgroup> bad: array<atomic<u32>, 4>; // [0]: a weight of this tile is outside f16's range
var<workgroup> bad_all: array<u32, 4>;

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
    atomicMax(&red[0], bitcast<u32>(m));
    workgroupBarrier();
    if (lid == 0u) {
        let mb = atomicLoad(&red[0]);
        var e = 0i;
        if (mb != 0u) {
            e = clamp(13i - (i32((mb >> 23u) & 0xffu) - 127i), -126i, 126i);
        }
        sc[2u * t] = ldexp(1.0, e);
        sc[2u * t + 1u] = ldexp(1.0, -e);
    }
}

// KPT consecutive k of W row `row` (bf16) and of token t (f32); 0 past cols (cols % 8 == 0, so
// a group of 8 is all in or all out).
struct Fetch {
    w0: vec4<u32>,
    w1: vec4<u32>,
    x0: vec4<f32>,
    x1: vec4<f32>,
    x2: vec4<f32>,
    x3: vec4<f32>,
}

fn fetch(row: u32, t: u32, k: u32) -> Fetch {
    var f = Fetch();
    if (k >= p.cols) {
        return f;
    }
    f.w0 = w[(row * p.cols + k) / 8u + 0u];
    if (k + 8u < p.cols) {
        f.w1 = w[(row * p.cols + k) / 8u + 1u];
    }
    f.x0 = x[(t * p.cols + k) / 4u + 0u];
    if (k + 4u < p.cols) {
        f.x1 = x[(t * p.cols + k) / 4u + 1u];
    }
    if (k + 8u < p.cols) {
        f.x2 = x[(t * p.cols + k) / 4u + 2u];
    }
    if (k + 12u < p.cols) {
        f.x3 = x[(t * p.cols + k) / 4u + 3u];
    }
    return f;
}

fn put_w(v: vec4<u32>, at: u32) {
    let w0 = vec4<f32>(bf_lo(v.x), bf_hi(v.x), bf_lo(v.y), bf_hi(v.y));
    let w1 = vec4<f32>(bf_lo(v.z), bf_hi(v.z), bf_lo(v.w), bf_hi(v.w));
    // Negated so that NaN counts as out of range too.
    if (!(max(max4(abs(w0)), max4(abs(w1))) < 65536.0)) {
        atomicOr(&bad[0], 1u);
    }
    wt[at] = vec4<f16>(w0);
    wt[at + 1u] = vec4<f16>(w1);
}

fn split(v: vec4<f32>, at: u32) {
    let hi = bitcast<vec4<f32>>(bitcast<vec4<u32>>(v) & vec4<u32>(0xffffe000u));
    xh[at] = vec4<f16>(hi);
    xl[at] = vec4<f16>(v - hi);
}

fn stage(buf: u32, n: u32, h: u32, f: Fetch, s: f32) {
    let at = buf * STAGE + n * SS + h * (KPT / 4u);
    put_w(f.w0, at + 0u);
    put_w(f.w1, at + 2u);
    split(f.x0 * s, at + 0u);
    split(f.x1 * s, at + 1u);
    split(f.x2 * s, at + 2u);
    split(f.x3 * s, at + 3u);
}

// Adds accumulator fragment `slot` into this lane's f32 sums through the subgroup's slice of
// cs (lane l: token l / 2, rows 8 (l % 2) .. +7 of the fragment).
fn drain(c: coop_mat16x16<f32, C>, slot: u32, sg: u32, lane: u32) {
    coopStoreT(c, &cs[sg * 256u], 16u);
    workgroupBarrier();
    let at = sg * 256u + (lane / 2u) * 16u + (lane % 2u) * 8u;
    fl[2u * slot] += vec4<f32>(cs[at], cs[at + 1u], cs[at + 2u], cs[at + 3u]);
    fl[2u * slot + 1u] += vec4<f32>(cs[at + 4u], cs[at + 5u], cs[at + 6u], cs[at + 7u]);
    workgroupBarrier();
}

// The f32 sums of fragment `slot` (tokens t..t+15, rows r..r+15) to y.
fn emit(slot: u32, t: u32, r: u32, lane: u32) {
    let tt = t + lane / 2u;
    let rr = r + (lane % 2u) * 8u;
    if (tt < p.tokens) {
        let inv = sc[2u * tt + 1u];
        let base = tt * p.y_stride + p.row_offset;
        let v0 = fl[2u * slot];
        let v1 = fl[2u * slot + 1u];
        for (var i = 0u; i < 8u; i++) {
            if (rr + i < p.rows) {
                store_y(base + rr + i, select(v1[i % 4u], v0[i % 4u], i < 4u) * inv);
            }
        }
    }
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
    stage(0u, n, h, fetch(wrow, xtok, h * KPT), s);
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
        let more = st + 1u < steps;
        var f = Fetch();
        if (more) {
            f = fetch(wrow, xtok, (st + 1u) * BK + h * KPT);
        }
        let wo = 0u * STAGE + ng * 32u * SS;
        let xo = 0u * STAGE + mg * 64u * SS;
        let b0_0 = coopLoad<coop_mat16x16<f16, B>>(&wt[wo], SS);
        let b1_0 = coopLoad<coop_mat16x16<f16, B>>(&wt[wo + 16u * SS], SS);
        let ah0_0 = coopLoadT<coop_mat16x16<f16, A>>(&xh[xo + 0u * SS], SS);
        c00 = coopMultiplyAdd(ah0_0, b0_0, c00);
        c01 = coopMultiplyAdd(ah0_0, b1_0, c01);
        let al0_0 = coopLoadT<coop_mat16x16<f16, A>>(&xl[xo + 0u * SS], SS);
        c00 = coopMultiplyAdd(al0_0, b0_0, c00);
        c01 = coopMultiplyAdd(al0_0, b1_0, c01);
        let ah1_0 = coopLoadT<coop_mat16x16<f16, A>>(&xh[xo + 16u * SS], SS);
        c10 = coopMultiplyAdd(ah1_0, b0_0, c10);
        c11 = coopMultiplyAdd(ah1_0, b1_0, c11);
        let al1_0 = coopLoadT<coop_mat16x16<f16, A>>(&xl[xo + 16u * SS], SS);
        c10 = coopMultiplyAdd(al1_0, b0_0, c10);
        c11 = coopMultiplyAdd(al1_0, b1_0, c11);
        let ah2_0 = coopLoadT<coop_mat16x16<f16, A>>(&xh[xo + 32u * SS], SS);
        c20 = coopMultiplyAdd(ah2_0, b0_0, c20);
        c21 = coopMultiplyAdd(ah2_0, b1_0, c21);
        let al2_0 = coopLoadT<coop_mat16x16<f16, A>>(&xl[xo + 32u * SS], SS);
        c20 = coopMultiplyAdd(al2_0, b0_0, c20);
        c21 = coopMultiplyAdd(al2_0, b1_0, c21);
        let ah3_0 = coopLoadT<coop_mat16x16<f16, A>>(&xh[xo + 48u * SS], SS);
        c30 = coopMultiplyAdd(ah3_0, b0_0, c30);
        c31 = coopMultiplyAdd(ah3_0, b1_0, c31);
        let al3_0 = coopLoadT<coop_mat16x16<f16, A>>(&xl[xo + 48u * SS], SS);
        c30 = coopMultiplyAdd(al3_0, b0_0, c30);
        c31 = coopMultiplyAdd(al3_0, b1_0, c31);
        let b0_1 = coopLoad<coop_mat16x16<f16, B>>(&wt[wo + 4u], SS);
        let b1_1 = coopLoad<coop_mat16x16<f16, B>>(&wt[wo + 16u * SS + 4u], SS);
        let ah0_1 = coopLoadT<coop_mat16x16<f16, A>>(&xh[xo + 0u * SS + 4u], SS);
        c00 = coopMultiplyAdd(ah0_1, b0_1, c00);
        c01 = coopMultiplyAdd(ah0_1, b1_1, c01);
        let al0_1 = coopLoadT<coop_mat16x16<f16, A>>(&xl[xo + 0u * SS + 4u], SS);
        c00 = coopMultiplyAdd(al0_1, b0_1, c00);
        c01 = coopMultiplyAdd(al0_1, b1_1, c01);
        let ah1_1 = coopLoadT<coop_mat16x16<f16, A>>(&xh[xo + 16u * SS + 4u], SS);
        c10 = coopMultiplyAdd(ah1_1, b0_1, c10);
        c11 = coopMultiplyAdd(ah1_1, b1_1, c11);
        let al1_1 = coopLoadT<coop_mat16x16<f16, A>>(&xl[xo + 16u * SS + 4u], SS);
        c10 = coopMultiplyAdd(al1_1, b0_1, c10);
        c11 = coopMultiplyAdd(al1_1, b1_1, c11);
        let ah2_1 = coopLoadT<coop_mat16x16<f16, A>>(&xh[xo + 32u * SS + 4u], SS);
        c20 = coopMultiplyAdd(ah2_1, b0_1, c20);
        c21 = coopMultiplyAdd(ah2_1, b1_1, c21);
        let al2_1 = coopLoadT<coop_mat16x16<f16, A>>(&xl[xo + 32u * SS + 4u], SS);
        c20 = coopMultiplyAdd(al2_1, b0_1, c20);
        c21 = coopMultiplyAdd(al2_1, b1_1, c21);
        let ah3_1 = coopLoadT<coop_mat16x16<f16, A>>(&xh[xo + 48u * SS + 4u], SS);
        c30 = coopMultiplyAdd(ah3_1, b0_1, c30);
        c31 = coopMultiplyAdd(ah3_1, b1_1, c31);
        let al3_1 = coopLoadT<coop_mat16x16<f16, A>>(&xl[xo + 48u * SS + 4u], SS);
        c30 = coopMultiplyAdd(al3_1, b0_1, c30);
        c31 = coopMultiplyAdd(al3_1, b1_1, c31);
        // Tensor-core accumulation truncates: sums of at most DRAIN steps (1024 k) go to f32.
        if (!more || (st + 1u) % DRAIN == 0u) {
            drain(c00, 0u, sg, lane);
            drain(c01, 1u, sg, lane);
            drain(c10, 2u, sg, lane);
            drain(c11, 3u, sg, lane);
            drain(c20, 4u, sg, lane);
            drain(c21, 5u, sg, lane);
            drain(c30, 6u, sg, lane);
            drain(c31, 7u, sg, lane);
            c00 = coop_mat16x16<f32, C>();
            c01 = coop_mat16x16<f32, C>();
            c10 = coop_mat16x16<f32, C>();
            c11 = coop_mat16x16<f32, C>();
            c20 = coop_mat16x16<f32, C>();
            c21 = coop_mat16x16<f32, C>();
            c30 = coop_mat16x16<f32, C>();
            c31 = coop_mat16x16<f32, C>();
        }
        workgroupBarrier();
        if (more) {
            stage(0u, n, h, f, s);
        }
        workgroupBarrier();
    }
    if (lid == 0u) {
        bad_all[0] = atomicLoad(&bad[0]);
    }
    if (workgroupUniformLoad(&bad_all)[0] != 0u) {
        exact_tile(r0, t0, lid);
        return;
    }
    emit(0u, t0 + mg * 64u + 0u, r0 + ng * 32u + 0u, lane);
    emit(1u, t0 + mg * 64u + 0u, r0 + ng * 32u + 16u, lane);
    emit(2u, t0 + mg * 64u + 16u, r0 + ng * 32u + 0u, lane);
    emit(3u, t0 + mg * 64u + 16u, r0 + ng * 32u + 16u, lane);
    emit(4u, t0 + mg * 64u + 32u, r0 + ng * 32u + 0u, lane);
    emit(5u, t0 + mg * 64u + 32u, r0 + ng * 32u + 16u, lane);
    emit(6u, t0 + mg * 64u + 48u, r0 + ng * 32u + 0u, lane);
    emit(7u, t0 + mg * 64u + 48u, r0 + ng * 32u + 16u, lane);
}
