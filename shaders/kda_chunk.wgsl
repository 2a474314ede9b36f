// Chunked (WY/UT) KDA prefill, spec 4.4: chunks of C = 64 rows, all in f32.
//   kda_chunk_cumsum: Gamma = within-chunk cumulative sum of g (in place; skipped where the
//                     prep wrote Gamma).
//   kda_chunk_intra:  per (chunk, head): A_kk, A_qk on 16x16 blocks (pairwise exponents on the
//                     diagonal blocks, or with DIAG_REF where the gate's bound allows it the first
//                     row as reference there too; the first row of the row's sub-chunk as
//                     reference off the diagonal; never e^-Gamma alone; each thread one element of every block,
//                     channels staged 16 at a time as vec4 quads), M = (I + diag(beta) A_kk)^-1 blockwise
//                     in place on the ten lower blocks (packed), then [w | u] = (M diag(beta))
//                     [K e^Gamma | V] as a register-tiled product (4x4 per thread, 64-column
//                     slices staged 32 rows at a time); qg = q e^Gamma and kg = k e^(Gamma_last -
//                     Gamma) on the way. 24 KiB of workgroup memory, one array reused by phase.
//   kda_chunk_state:  per (head, tile of SBV value columns), sequential over chunks: keep S_n
//                     (workgroup memory, K <= 128; kda_chunk_state16 beyond), store it for
//                     kda_chunk_out; U = u - w S_n (4 rows x 2 columns per thread, w staged
//                     transposed in 64-channel slices); S = diag(e^Gamma_last) S_n + kg^T U
//                     (4 channels x 2 columns per thread). kda_chunk_state_r32: the same with S
//                     in registers (8 x 4 per thread), 32 columns per workgroup, 16 KiB (the
//                     default where K <= 128).
//                     kda_chunk_state_b (lib/kda_state_b.wgsl): S in registers, a column x 64
//                     channels per thread, w and kg read as broadcasts, 32 columns per
//                     workgroup, 16 KiB.
// In intra (phases 1 and 4), state and out the next staged slice's global loads are issued before the
// current slice is used (one slice in flight in registers).
// Inner loops run a constant trip count (tiles zero-filled past K and past the last row), 4
// steps at a time with the loads first. Workgroup memory stays below 48 KiB per kernel
// (NVIDIA's Vulkan limit: a 57 KiB kernel hung the H200; lavapipe runs kernels above the 32
// KiB it reports, so the tests do not catch an overrun); all but state (41 KB) stay within
// 32 KiB (Metal, DX12), state_b and state_r32 within 16 KiB. The host runs intra (f32 outputs),
// state and out without wgpu's runtime bounds checks: every index is in range by
// construction (global reads are guarded by row < nv and channel/column < K).
//   kda_chunk_out:    per (chunk, head, tile of OVT columns), in parallel: O = [qg | A_qk] [S_n ; U]
//                     as one register-tiled product (8x4 per thread, inner dimension in slices of 32).
// The ragged last chunk uses only its valid rows (Gamma_last from the last valid row).
//
// Preconditions (checked on the host): K = V, a multiple of 16, <= 256; inputs come from
// kda_prep: q (l2n, scaled), k (l2n), v, g [T, H, K]; beta [T, H]; state [H, K, V] f32.

struct KdaChunkParams {
    t_len: u32,
    heads: u32,
    dk: u32,
    nchunks: u32,
}

@group(0) @binding(0) var<uniform> p: KdaChunkParams;
@group(0) @binding(1) var<storage, read> q: array<f32>;          // [T, H, K]
@group(0) @binding(2) var<storage, read> k: array<f32>;          // [T, H, K]
@group(0) @binding(3) var<storage, read> v: array<f32>;          // [T, H, V]
@group(0) @binding(4) var<storage, read_write> gam: array<f32>;  // [T, H, K] g, then Gamma
@group(0) @binding(5) var<storage, read> beta: array<f32>;       // [T, H]
@group(0) @binding(6) var<storage, read_write> w: array<f32>;    // [T, H, K]
@group(0) @binding(7) var<storage, read_write> u: array<f32>;    // [T, H, V]
@group(0) @binding(8) var<storage, read_write> qg: array<f32>;   // [T, H, K]
@group(0) @binding(9) var<storage, read_write> kg: array<f32>;   // [T, H, K]
@group(0) @binding(10) var<storage, read_write> aqk: array<f32>; // [N, H, C, C]
@group(0) @binding(11) var<storage, read_write> state: array<f32>; // [H, K, V]
@group(0) @binding(12) var<storage, read_write> o: array<f32>;   // [T, H, V]
// kda_chunk_intra's diagonal blocks through their first row as reference, like the others,
// instead of a pairwise exponent per (i, j, channel): k_i e^(Gamma_i - Gamma_n) . k_j
// e^(Gamma_n - Gamma_j). The second factor grows up to e^(15 |g|max), so the host sets this only
// for the bounded gate with a lower bound >= -5.5 (e^82.5 times 128 terms stays below f32's
// e^88.7); the pairwise form cannot overflow whatever the gate.
override DIAG_REF: bool = false;

const WG: u32 = 256u;
const C: u32 = 64u;       // chunk rows
const SUB: u32 = 16u;      // sub-chunk rows

fn rows_in(n: u32) -> u32 {
    return min(C, p.t_len - n * C);
}

// One thread per (chunk, head, key channel).
@compute @workgroup_size(256)
fn kda_chunk_cumsum(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * WG;
    let hk = p.heads * p.dk;
    if (i >= p.nchunks * hk) {
        return;
    }
    let n = i / hk;
    let j = i % hk;
    var run = 0.0;
    for (var r = 0u; r < rows_in(n); r++) {
        let at = (n * C + r) * hk + j;
        run += gam[at];
        gam[at] = run;
    }
}


// ---------------------------------------------------------------------------------------
// kda_chunk_intra
// One workgroup array `sh` (24 KiB), reused by phase. On the H200 (Vulkan) the declared size
// sets how many workgroups share an SM: an earlier form took 3.53 ms at T = 8192 x 96 heads
// with 14 or 16 KiB, 4.44 ms padded to 20 KiB and 4.35 ms padded to 32 KiB; staging phase 4's
// row blocks two at a time (14 -> 18 KiB, 100 -> 128 registers: two workgroups per SM either
// way) took it 2.67 -> 2.62 ms, and phase 1's 16-channel slices (18 -> 24 KiB, half the
// barriers, every thread staging) 2.62 -> 2.57 ms. The phases:
//   phase 1: one staged 16-channel slice (NQ = 4 channel quads), 1536 vec4, layout below;
//   phases 2-3: A = diag(beta) A_kk, then M = (I + A)^-1 in place, as the ten lower 16x16
//     blocks packed (block (a, b), b <= a, row-major at scalar pb(a, b)): 640 vec4; the
//     inverse's block products T [3, 16, 16] after them (SH_T, 192 vec4);
//   phase 4: M (packed) and two staged 16-row blocks of the right-hand side (SH_B, SH_B2,
//     256 vec4 each).
// Phase 1 staging: per operand [NQ channel quads, rows] of vec4 (quad-major, so a row's 4
// channels are one vec4 load and consecutive rows are consecutive vec4s). With DIAG_REF the
// first three hold k_j e^(Gamma_n(j) - Gamma_j) (all rows) and rows 0..15's k and q times
// e^(Gamma_r - Gamma_0) (P_LK and P_LQ's block 0) instead.
const KS: u32 = 16u;         // channels per staged slice
const NQ: u32 = KS / 4u;     // channel quads per staged slice
const P_TK: u32 = 0u;        // [NQ, 64] k
const P_TQ: u32 = 64u * NQ;  // [NQ, 64] q
const P_TG: u32 = 128u * NQ; // [NQ, 64] Gamma
const P_LK: u32 = 192u * NQ; // [NQ, 48] rows 16..63: k_r e^(Gamma_r - Gamma_n(r)), n(r) = first row of r's sub-chunk
const P_LQ: u32 = 240u * NQ; // [NQ, 48] rows 16..63: q_r e^(Gamma_r - Gamma_n(r))
const P_RK: u32 = 288u * NQ; // for n = 16 a, a = 1, 2, 3: [NQ, n] k_j e^(Gamma_n - Gamma_j), j < n, at P_RK + 8 NQ a (a - 1)
const SH_T: u32 = 640u;      // T of the inverse [3, 16, 16] (vec4 index)
const SH_B: u32 = 640u;      // phase 4's staged right-hand side blocks [16 rows, 16 column quads]
const SH_B2: u32 = 896u;
var<workgroup> sh: array<vec4<f32>, max(384u * NQ, SH_B2 + 256u)>;  // phase 1 staging or phases 2-4

fn s_get(e: u32) -> f32 {
    return sh[e >> 2u][e & 3u];
}

fn s_set(e: u32, x: f32) {
    sh[e >> 2u][e & 3u] = x;
}

// Scalar offset of packed block (a, b), b <= a.
fn pb(a: u32, b: u32) -> u32 {
    return (a * (a + 1u) / 2u + b) * SUB * SUB;
}

// (k_i . kj', q_i . kj') over one channel quad (base = quad * 64) with kj' = k_j e^(Gamma_i -
// Gamma_j) of one diagonal-block pair; the exponent is clamped at 0 (pairs j > i are masked).
fn diag_pair(base: u32, ri: u32, rj: u32) -> vec2<f32> {
    let kj = sh[P_TK + base + rj] * exp(min(sh[P_TG + base + ri] - sh[P_TG + base + rj], vec4<f32>(0.0)));
    return vec2<f32>(dot(sh[P_TK + base + ri], kj), dot(sh[P_TQ + base + ri], kj));
}

fn off_pair(lk: vec4<f32>, lq: vec4<f32>, at: u32) -> vec2<f32> {
    let rk = sh[at];
    return vec2<f32>(dot(lk, rk), dot(lq, rk));
}

// Element (i, j) of block (a, b) of A_kk, scaled by `br` (beta of row 16 a + i), into the
// packed A (b <= a; strictly lower, 0 past the last row).
fn put_kk(a: u32, b: u32, i: u32, j: u32, x: f32, nv: u32, br: f32) {
    let ok = a * SUB + i < nv && (b < a || j < i);
    s_set(pb(a, b) + i * SUB + j, select(0.0, br * x, ok));
}

// Element (i, j) of block (a, b) of A_qk (lower with the diagonal, zero above the diagonal
// blocks and past the last row) to global memory.
fn put_qk(a: u32, b: u32, i: u32, j: u32, x: f32, nv: u32, abase: u32) {
    let r = a * SUB + i;
    let ok = r < nv && b <= a && (b < a || j <= i);
    aqk[abase + r * C + b * SUB + j] = select(0.0, x, ok);
}

// The global loads of one phase-1 slice of kda_chunk_intra (thread = (row, channel quad)):
// k, q, Gamma, Gamma of the row's sub-chunk reference and of the references 16, 32, 48.
struct P1Raw {
    k: vec4<f32>,
    q: vec4<f32>,
    g: vec4<f32>,
    gn: vec4<f32>,
    g1: vec4<f32>,
    g2: vec4<f32>,
    g3: vec4<f32>,
}

// vec4 views of q, k, v and Gamma for kda_chunk_intra's loads (rows and channel quads start
// on a quad: K is a multiple of 16).
@group(0) @binding(1) var<storage, read> q4: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> k4: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> v4: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> gamv: array<vec4<f32>>;

fn gam4(at: u32) -> vec4<f32> {
    return gamv[at / 4u];
}

fn p1_fetch(c0: u32, t0: u32, nv: u32, hk: u32, h: u32, lid: u32) -> P1Raw {
    var x: P1Raw;
    let r = lid / NQ;
    if (lid < C * NQ && c0 < p.dk && r < nv) {
        let ch = h * p.dk + c0 + 4u * (lid % NQ);
        let at = (t0 + r) * hk + ch;
        x.k = k4[at / 4u];
        x.q = q4[at / 4u];
        x.g = gam4(at);
        x.gn = gam4((t0 + (r / SUB) * SUB) * hk + ch);
        if (r < SUB && SUB < nv) {
            x.g1 = gam4((t0 + SUB) * hk + ch);
        }
        if (r < 2u * SUB && 2u * SUB < nv) {
            x.g2 = gam4((t0 + 2u * SUB) * hk + ch);
        }
        if (r < 3u * SUB && 3u * SUB < nv) {
            x.g3 = gam4((t0 + 3u * SUB) * hk + ch);
        }
    }
    return x;
}

// The global loads of one phase-4 step (slice s = st / nmb of 64 columns, row block mb = st %
// nmb): thread (row 16 mb + lid / 16, column quad lid % 16) loads k, Gamma, q and Gamma of the
// last row (w slices) or v (in `k`, u slices).
struct P4Raw {
    k: vec4<f32>,
    g: vec4<f32>,
    q: vec4<f32>,
    gl: vec4<f32>,
}

fn p4_fetch(st: u32, nmb: u32, nsl: u32, t0: u32, nv: u32, hk: u32, h: u32, glast: u32, lid: u32) -> P4Raw {
    var x: P4Raw;
    let s = st / nmb;
    let isk = s < nsl;
    let m = (st % nmb) * SUB + lid / 16u;
    let col = select(s - nsl, s, isk) * 64u + 4u * (lid % 16u);
    if (m < nv && col < p.dk) {
        let at = (t0 + m) * hk + h * p.dk + col;
        if (isk) {
            x.k = k4[at / 4u];
            x.g = gam4(at);
            x.q = q4[at / 4u];
            x.gl = gam4(glast + col);
        } else {
            x.k = v4[at / 4u];
        }
    }
    return x;
}

// p4_fetch for step st of the paired form: row block 2 (st % npair) + second of slice st / npair.
fn p4_fetch2(st: u32, npair: u32, nsl: u32, t0: u32, nv: u32, hk: u32, h: u32, glast: u32, lid: u32, second: u32) -> P4Raw {
    let s = st / npair;
    let mb = 2u * (st % npair) + second;
    return p4_fetch(s * 4u + mb, 4u, nsl, t0, nv, hk, h, glast, lid);
}

// Stages row 16 mb + i, column quad j of phase 4's right-hand side at `at_sh` (diag(beta) and,
// for the w slices, e^Gamma applied; zero past the last row and past K); the w slices also
// write qg and kg there.
fn p4_stage(rb: P4Raw, mb: u32, isk: bool, cb: u32, t0: u32, nv: u32, hk: u32, h: u32, bet: vec4<f32>, i: u32, j: u32, at_sh: u32) {
    let m = mb * SUB + i;
    let col = cb + 4u * j;
    var xs = rb.k * bet[min(mb, 3u)];
    if (isk) {
        let eg = exp(rb.g);
        xs *= eg;
        if (m < nv && col < p.dk) {
            let at = (t0 + m) * hk + h * p.dk + col;
            let qgv = rb.q * eg;
            let kgv = rb.k * exp(rb.gl - rb.g);
            qg4[at / 4u] = qgv;
            kg4[at / 4u] = kgv;
        }
    }
    sh[at_sh + i * 16u + j] = xs;
}

fn beta_row(t0: u32, nv: u32, h: u32, r: u32) -> f32 {
    return select(0.0, beta[(t0 + min(r, nv - 1u)) * p.heads + h], r < nv);
}

@compute @workgroup_size(256)
fn kda_chunk_intra(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let id = wg.x + wg.y * nwg.x;
    if (id >= p.nchunks * p.heads) {
        return;
    }
    let n = id / p.heads;
    let h = id % p.heads;
    let nv = rows_in(n);
    let hk = p.heads * p.dk;
    let t0 = n * C;
    // Phase 1: thread (i, j) accumulates element (16a + i, 16b + j) of every lower block (a, b).
    let i = lid / SUB;
    let j = lid % SUB;
    // beta of rows i, 16 + i, 32 + i, 48 + i (the thread's block rows in phase 2, its staged
    // rows in phase 4); 0 past the last row.
    let bet = vec4<f32>(beta_row(t0, nv, h, i), beta_row(t0, nv, h, SUB + i), beta_row(t0, nv, h, 2u * SUB + i),
        beta_row(t0, nv, h, 3u * SUB + i));
    var d0 = vec2<f32>(0.0);
    var d1 = vec2<f32>(0.0);
    var d2 = vec2<f32>(0.0);
    var d3 = vec2<f32>(0.0);
    var o10 = vec2<f32>(0.0);
    var o20 = vec2<f32>(0.0);
    var o21 = vec2<f32>(0.0);
    var o30 = vec2<f32>(0.0);
    var o31 = vec2<f32>(0.0);
    var o32 = vec2<f32>(0.0);
    var raw = p1_fetch(0u, t0, nv, hk, h, lid);
    for (var c0 = 0u; c0 < p.dk; c0 += KS) {
        if (lid < C * NQ) {
            // One (row, channel quad) per thread, from the loads issued a slice earlier.
            let r = lid / NQ;
            let cq = lid % NQ;
            let kx = raw.k;
            let qx = raw.q;
            let gx = raw.g;
            let s = cq * 64u + r;
            // <= 0 for valid rows (Gamma is non-increasing).
            let sc = exp(gx - raw.gn);
            if (DIAG_REF) {
                sh[P_TK + s] = kx * exp(raw.gn - gx);
                if (r < SUB) {
                    sh[P_TQ + s] = kx * sc;
                    sh[P_TG + s] = qx * sc;
                }
            } else {
                sh[P_TK + s] = kx;
                sh[P_TQ + s] = qx;
                sh[P_TG + s] = gx;
            }
            if (r >= SUB) {
                sh[P_LK + cq * 48u + r - SUB] = kx * sc;
                sh[P_LQ + cq * 48u + r - SUB] = qx * sc;
            }
            if (r < SUB) {
                sh[P_RK + cq * SUB + r] = select(vec4<f32>(0.0), kx * exp(raw.g1 - gx), SUB < nv);
            }
            if (r < 2u * SUB) {
                sh[P_RK + NQ * SUB + cq * 2u * SUB + r] = select(vec4<f32>(0.0), kx * exp(raw.g2 - gx), 2u * SUB < nv);
            }
            if (r < 3u * SUB) {
                sh[P_RK + 3u * NQ * SUB + cq * 3u * SUB + r] = select(vec4<f32>(0.0), kx * exp(raw.g3 - gx), 3u * SUB < nv);
            }
        }
        workgroupBarrier();
        raw = p1_fetch(c0 + KS, t0, nv, hk, h, lid);
        for (var cq = 0u; cq < NQ; cq++) {
            let base = cq * 64u;
            let lb = cq * 48u + i;
            let lk1 = sh[P_LK + lb];
            let lq1 = sh[P_LQ + lb];
            let lk2 = sh[P_LK + lb + SUB];
            let lq2 = sh[P_LQ + lb + SUB];
            let lk3 = sh[P_LK + lb + 2u * SUB];
            let lq3 = sh[P_LQ + lb + 2u * SUB];
            if (DIAG_REF) {
                let db = P_TK + base + j;
                d0 += off_pair(sh[P_TQ + base + i], sh[P_TG + base + i], db);
                d1 += off_pair(lk1, lq1, db + SUB);
                d2 += off_pair(lk2, lq2, db + 2u * SUB);
                d3 += off_pair(lk3, lq3, db + 3u * SUB);
            } else {
                d0 += diag_pair(base, i, j);
                d1 += diag_pair(base, SUB + i, SUB + j);
                d2 += diag_pair(base, 2u * SUB + i, 2u * SUB + j);
                d3 += diag_pair(base, 3u * SUB + i, 3u * SUB + j);
            }
            let r1 = P_RK + cq * SUB + j;
            let r2 = P_RK + NQ * SUB + cq * 2u * SUB + j;
            let r3 = P_RK + 3u * NQ * SUB + cq * 3u * SUB + j;
            o10 += off_pair(lk1, lq1, r1);
            o20 += off_pair(lk2, lq2, r2);
            o21 += off_pair(lk2, lq2, r2 + SUB);
            o30 += off_pair(lk3, lq3, r3);
            o31 += off_pair(lk3, lq3, r3 + SUB);
            o32 += off_pair(lk3, lq3, r3 + 2u * SUB);
        }
        workgroupBarrier();
    }
    // Phase 2: A_qk (lower, with diagonal) out, every block (zeros above the diagonal blocks
    // and in rows past the end); A = diag(beta) A_kk (strictly lower) into the packed blocks.
    let abase = id * C * C;
    put_qk(0u, 0u, i, j, d0.y, nv, abase);
    put_qk(1u, 0u, i, j, o10.y, nv, abase);
    put_qk(1u, 1u, i, j, d1.y, nv, abase);
    put_qk(2u, 0u, i, j, o20.y, nv, abase);
    put_qk(2u, 1u, i, j, o21.y, nv, abase);
    put_qk(2u, 2u, i, j, d2.y, nv, abase);
    put_qk(3u, 0u, i, j, o30.y, nv, abase);
    put_qk(3u, 1u, i, j, o31.y, nv, abase);
    put_qk(3u, 2u, i, j, o32.y, nv, abase);
    put_qk(3u, 3u, i, j, d3.y, nv, abase);
    put_qk(0u, 1u, i, j, 0.0, nv, abase);
    put_qk(0u, 2u, i, j, 0.0, nv, abase);
    put_qk(0u, 3u, i, j, 0.0, nv, abase);
    put_qk(1u, 2u, i, j, 0.0, nv, abase);
    put_qk(1u, 3u, i, j, 0.0, nv, abase);
    put_qk(2u, 3u, i, j, 0.0, nv, abase);
    put_kk(0u, 0u, i, j, d0.x, nv, bet[0]);
    put_kk(1u, 0u, i, j, o10.x, nv, bet[1]);
    put_kk(1u, 1u, i, j, d1.x, nv, bet[1]);
    put_kk(2u, 0u, i, j, o20.x, nv, bet[2]);
    put_kk(2u, 1u, i, j, o21.x, nv, bet[2]);
    put_kk(2u, 2u, i, j, d2.x, nv, bet[2]);
    put_kk(3u, 0u, i, j, o30.x, nv, bet[3]);
    put_kk(3u, 1u, i, j, o31.x, nv, bet[3]);
    put_kk(3u, 2u, i, j, o32.x, nv, bet[3]);
    put_kk(3u, 3u, i, j, d3.x, nv, bet[3]);
    workgroupBarrier();
    // Phase 3: M = (I + A)^-1 (A strictly lower), blockwise in f32 (spec 4.4), in place of A:
    // the 16x16 diagonal blocks by forward substitution (a column per thread, in registers, 16
    // terms per row at a constant trip count: 3 % faster on the H200 than the triangular loop
    // through workgroup memory), then block row a = 1, 2, 3: T_ab = sum_{m=b}^{a-1} A_am M_mb
    // for every b < a (A's row a is then no longer read), M_ab = -M_aa T_ab over A_ab.
    var x: array<f32, 16>;
    let xb = pb(lid / SUB, lid / SUB);
    if (lid < C) {
        // Column j of the diagonal block M_aa (x[m] = M[16a + m][16a + j]), every thread
        // through the same rows (A_aa is strictly lower: zero for m >= ii).
        x[0] = select(0.0, 1.0, j == 0u);
        for (var ii = 1u; ii < SUB; ii++) {
            let ar = (xb + ii * SUB) / 4u;
            let acc = dot(sh[ar], vec4<f32>(x[0], x[1], x[2], x[3])) + dot(sh[ar + 1u], vec4<f32>(x[4], x[5], x[6], x[7]))
                + dot(sh[ar + 2u], vec4<f32>(x[8], x[9], x[10], x[11])) + dot(sh[ar + 3u], vec4<f32>(x[12], x[13], x[14], x[15]));
            x[ii] = select(select(0.0, 1.0, ii == j), -acc, ii > j);
        }
    }
    workgroupBarrier();
    if (lid < C) {
        // The whole column: zeros above the diagonal, which phase 4 reads.
        for (var ii = 0u; ii < SUB; ii++) {
            s_set(xb + ii * SUB + j, x[ii]);
        }
    }
    workgroupBarrier();
    for (var a = 1u; a < C / SUB; a++) {
        // T_ab (element (i, j) of each block b < a) into SH_T.
        for (var b = 0u; b < a; b++) {
            var acc = 0.0;
            for (var mb = b; mb < a; mb++) {
                let ar = pb(a, mb) / 4u + i * 4u;
                let mc = pb(mb, b) + j;
                for (var mq = 0u; mq < 4u; mq++) {
                    let av = sh[ar + mq];
                    let e = mc + mq * 64u;
                    acc += av.x * s_get(e) + av.y * s_get(e + 16u) + av.z * s_get(e + 32u) + av.w * s_get(e + 48u);
                }
            }
            s_set(SH_T * 4u + b * SUB * SUB + i * SUB + j, acc);
        }
        workgroupBarrier();
        let mr = pb(a, a) / 4u + i * 4u;
        for (var b = 0u; b < a; b++) {
            var acc = 0.0;
            let tc = SH_T * 4u + b * SUB * SUB + j;
            for (var mq = 0u; mq < 4u; mq++) {
                let mv = sh[mr + mq];
                let e = tc + mq * 64u;
                acc += mv.x * s_get(e) + mv.y * s_get(e + 16u) + mv.z * s_get(e + 32u) + mv.w * s_get(e + 48u);
            }
            s_set(pb(a, b) + i * SUB + j, -acc);
        }
        workgroupBarrier();
    }
    // Phase 4: [w | u] = M diag(beta) B, B = [K e^Gamma | V], in slices of 64 columns (first
    // the K/64 slices of w, then those of u), each staged two blocks of 16 rows at a time
    // (diag(beta) applied there) with the next pair's loads issued before the current one is
    // used. The
    // staging threads also write qg and kg. Thread (i, j): rows 4 i .. 4 i + 3 (in row block
    // ra), columns 4 j .. 4 j + 3 of the slice; row block mb adds M_{ra, mb} B_mb for mb <= ra.
    let glast = (t0 + nv - 1u) * hk + h * p.dk;
    let nsl = (p.dk + 63u) / 64u;
    let nmb = (nv + SUB - 1u) / SUB;
    // Two row blocks per step (the second zero where nmb is odd): half the steps and barriers.
    let npair = (nmb + 1u) / 2u;
    let nst = 2u * nsl * npair;
    let r0 = 4u * i;
    let ra = lid / 64u;
    var acc0 = vec4<f32>(0.0);
    var acc1 = vec4<f32>(0.0);
    var acc2 = vec4<f32>(0.0);
    var acc3 = vec4<f32>(0.0);
    var rb = p4_fetch2(0u, npair, nsl, t0, nv, hk, h, glast, lid, 0u);
    var rc = p4_fetch2(0u, npair, nsl, t0, nv, hk, h, glast, lid, 1u);
    for (var st = 0u; st < nst; st++) {
        let s = st / npair;
        let pr = st % npair;
        let isk = s < nsl;
        let cb = select(s - nsl, s, isk) * 64u;
        p4_stage(rb, 2u * pr, isk, cb, t0, nv, hk, h, bet, i, j, SH_B);
        p4_stage(rc, 2u * pr + 1u, isk, cb, t0, nv, hk, h, bet, i, j, SH_B2);
        workgroupBarrier();
        if (st + 1u < nst) {
            rb = p4_fetch2(st + 1u, npair, nsl, t0, nv, hk, h, glast, lid, 0u);
            rc = p4_fetch2(st + 1u, npair, nsl, t0, nv, hk, h, glast, lid, 1u);
        }
        for (var half = 0u; half < 2u; half++) {
            let mb = 2u * pr + half;
            let bb = select(SH_B, SH_B2, half == 1u);
            if (ra >= mb && mb < nmb) {
                // M's rows r0 .. r0 + 3 over the block's 16 columns, 4 columns per step as vec4s;
                // in the diagonal block only up to column r0 + 3 (M is zero above the diagonal).
                let mq0 = pb(ra, mb) / 4u + (r0 % SUB) * 4u;
                let mqe = select(4u, (r0 % SUB) / 4u + 1u, ra == mb);
                for (var mq = 0u; mq < mqe; mq++) {
                    let b0 = sh[bb + mq * 64u + j];
                    let b1 = sh[bb + mq * 64u + 16u + j];
                    let b2 = sh[bb + mq * 64u + 32u + j];
                    let b3 = sh[bb + mq * 64u + 48u + j];
                    let m0 = sh[mq0 + mq];
                    let m1 = sh[mq0 + 4u + mq];
                    let m2 = sh[mq0 + 8u + mq];
                    let m3 = sh[mq0 + 12u + mq];
                    acc0 += m0.x * b0 + m0.y * b1 + m0.z * b2 + m0.w * b3;
                    acc1 += m1.x * b0 + m1.y * b1 + m1.z * b2 + m1.w * b3;
                    acc2 += m2.x * b0 + m2.y * b1 + m2.z * b2 + m2.w * b3;
                    acc3 += m3.x * b0 + m3.y * b1 + m3.z * b2 + m3.w * b3;
                }
            }
        }
        if (pr + 1u == npair) {
            let col = cb + 4u * j;
            if (col < p.dk) {
                let at0 = (t0 + r0) * hk + h * p.dk + col;
                for (var ii = 0u; ii < 4u; ii++) {
                    if (r0 + ii < nv) {
                        var y = acc0;
                        if (ii == 1u) {
                            y = acc1;
                        } else if (ii == 2u) {
                            y = acc2;
                        } else if (ii == 3u) {
                            y = acc3;
                        }
                        let at = at0 + ii * hk;
                        if (!isk) {
                            u4[at / 4u] = y;
                        } else {
                            w4[at / 4u] = y;
                        }
                    }
                }
            }
            acc0 = vec4<f32>(0.0);
            acc1 = vec4<f32>(0.0);
            acc2 = vec4<f32>(0.0);
            acc3 = vec4<f32>(0.0);
        }
        workgroupBarrier();
    }
}

// ---------------------------------------------------------------------------------------
// kda_chunk_state: one workgroup per (head, tile of SBV value columns), sequential over chunks.
const SBV: u32 = 32u;     // value columns per state workgroup (16 column pairs)
var<workgroup> st_s: array<vec2<f32>, 2048>;  // [K, 16] state tile S_n (K <= 128)
// W^T slice [64 channels, 17 (16 row quads + pad)] in the U phase, kg slice [64 rows, 16
// channel quads] in the S phase.
var<workgroup> st_t: array<vec4<f32>, 1088>;
var<workgroup> st_u: array<vec2<f32>, 1024>;  // [C, 16] U of the chunk

@group(0) @binding(13) var<storage, read_write> hs: array<f32>;  // [N, H, K, V] state before each chunk

// The global loads of the next staged slice are issued before the current one is used
// (one register slice in flight): stages per chunk are the nsl w^T slices, then the nsl kg ones.
fn st_fetch(n: u32, s: u32, nsl: u32, h: u32, lid: u32) -> array<vec4<f32>, 4> {
    var out: array<vec4<f32>, 4>;
    if (n >= p.nchunks) {
        return out;
    }
    let hk = p.heads * p.dk;
    let t0 = n * C;
    let nv = rows_in(n);
    let isw = s < nsl;
    let c0 = select(s - nsl, s, isw) * 64u;
    for (var i = 0u; i < 4u; i++) {
        let e = lid + i * WG;
        var x = vec4<f32>(0.0);
        if (isw) {
            let ch = c0 + e % 64u;
            let r = 4u * (e / 64u);
            if (ch < p.dk) {
                let at = (t0 + r) * hk + h * p.dk + ch;
                if (r < nv) {
                    x.x = w[at];
                }
                if (r + 1u < nv) {
                    x.y = w[at + hk];
                }
                if (r + 2u < nv) {
                    x.z = w[at + 2u * hk];
                }
                if (r + 3u < nv) {
                    x.w = w[at + 3u * hk];
                }
            }
        } else {
            let ch = c0 + 4u * (e % 16u);
            let r = e / 16u;
            if (r < nv && ch < p.dk) {
                let at = (t0 + r) * hk + h * p.dk + ch;
                x = vec4<f32>(kg[at], kg[at + 1u], kg[at + 2u], kg[at + 3u]);
            }
        }
        out[i] = x;
    }
    return out;
}

@compute @workgroup_size(256)
fn kda_chunk_state(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let tiles = (p.dk + SBV - 1u) / SBV;
    let id = wg.x + wg.y * nwg.x;
    if (id >= p.heads * tiles) {
        return;
    }
    let h = id / tiles;
    let v0 = (id % tiles) * SBV;
    let hk = p.heads * p.dk;
    let kv = p.dk * p.dk;
    let cg = lid % 16u;       // column pair
    let q4 = lid / 16u;       // U phase: rows 4 q4 ..; S phase: channels 4 q4 .. of the slice
    let col = v0 + 2u * cg;
    let live = col < p.dk;    // V is a multiple of 16: both columns or neither
    for (var c = q4; c < p.dk; c += 16u) {
        var x = vec2<f32>(0.0);
        if (live) {
            let at = h * kv + c * p.dk + col;
            x = vec2<f32>(state[at], state[at + 1u]);
        }
        st_s[c * 16u + cg] = x;
    }
    let nsl = (p.dk + 63u) / 64u;
    var pf = st_fetch(0u, 0u, nsl, h, lid);
    for (var n = 0u; n < p.nchunks; n++) {
        let t0 = n * C;
        let nv = rows_in(n);
        var uin: array<vec2<f32>, 4>;
        for (var ii = 0u; ii < 4u; ii++) {
            let r = 4u * q4 + ii;
            if (r < nv && live) {
                let at = (t0 + r) * hk + h * p.dk + col;
                uin[ii] = vec2<f32>(u[at], u[at + 1u]);
            }
        }
        var a0 = vec2<f32>(0.0);
        var a1 = vec2<f32>(0.0);
        var a2 = vec2<f32>(0.0);
        var a3 = vec2<f32>(0.0);
        let glast = (t0 + nv - 1u) * hk + h * p.dk;
        let hb = (n * p.heads + h) * kv + col;
        for (var s = 0u; s < 2u * nsl; s++) {
            workgroupBarrier();
            let isw = s < nsl;
            for (var i = 0u; i < 4u; i++) {
                let e = lid + i * WG;
                if (isw) {
                    st_t[(e % 64u) * 17u + e / 64u] = pf[i];
                } else {
                    st_t[e] = pf[i];
                }
            }
            workgroupBarrier();
            if (s + 1u < 2u * nsl) {
                pf = st_fetch(n, s + 1u, nsl, h, lid);
            } else {
                pf = st_fetch(n + 1u, 0u, nsl, h, lid);
            }
            if (isw) {
                // A constant trip count (channels past K are zero in both tiles), 4 per step
                // with the loads first.
                let c0 = s * 64u;
                for (var cc = 0u; cc < 64u; cc += 4u) {
                    let w0 = st_t[cc * 17u + q4];
                    let w1 = st_t[(cc + 1u) * 17u + q4];
                    let w2 = st_t[(cc + 2u) * 17u + q4];
                    let w3 = st_t[(cc + 3u) * 17u + q4];
                    let sb = (c0 + cc) * 16u + cg;
                    let s0 = st_s[sb];
                    let s1 = st_s[sb + 16u];
                    let s2 = st_s[sb + 32u];
                    let s3 = st_s[sb + 48u];
                    a0 += w0.x * s0;
                    a1 += w0.y * s0;
                    a2 += w0.z * s0;
                    a3 += w0.w * s0;
                    a0 += w1.x * s1;
                    a1 += w1.y * s1;
                    a2 += w1.z * s1;
                    a3 += w1.w * s1;
                    a0 += w2.x * s2;
                    a1 += w2.y * s2;
                    a2 += w2.z * s2;
                    a3 += w2.w * s2;
                    a0 += w3.x * s3;
                    a1 += w3.y * s3;
                    a2 += w3.z * s3;
                    a3 += w3.w * s3;
                }
                if (s + 1u == nsl) {
                    // U = u - w S_n (rows past the end and idle columns are 0).
                    for (var ii = 0u; ii < 4u; ii++) {
                        let r = 4u * q4 + ii;
                        var acc = a0;
                        if (ii == 1u) {
                            acc = a1;
                        } else if (ii == 2u) {
                            acc = a2;
                        } else if (ii == 3u) {
                            acc = a3;
                        }
                        var uu = vec2<f32>(0.0);
                        if (r < nv && live) {
                            let at = (t0 + r) * hk + h * p.dk + col;
                            uu = uin[ii] - acc;
                            u[at] = uu.x;
                            u[at + 1u] = uu.y;
                        }
                        st_u[r * 16u + cg] = uu;
                    }
                }
            } else {
                let ch0 = (s - nsl) * 64u + 4u * q4;
                if (ch0 < p.dk) {
                    var s0 = st_s[ch0 * 16u + cg];
                    var s1 = st_s[(ch0 + 1u) * 16u + cg];
                    var s2 = st_s[(ch0 + 2u) * 16u + cg];
                    var s3 = st_s[(ch0 + 3u) * 16u + cg];
                    if (live) {
                        let at = hb + ch0 * p.dk;
                        hs[at] = s0.x;
                        hs[at + 1u] = s0.y;
                        hs[at + p.dk] = s1.x;
                        hs[at + p.dk + 1u] = s1.y;
                        hs[at + 2u * p.dk] = s2.x;
                        hs[at + 2u * p.dk + 1u] = s2.y;
                        hs[at + 3u * p.dk] = s3.x;
                        hs[at + 3u * p.dk + 1u] = s3.y;
                    }
                    let dec = exp(vec4<f32>(gam[glast + ch0], gam[glast + ch0 + 1u], gam[glast + ch0 + 2u], gam[glast + ch0 + 3u]));
                    s0 *= dec.x;
                    s1 *= dec.y;
                    s2 *= dec.z;
                    s3 *= dec.w;
                    // Rows past the end are zero in both tiles: a constant trip count.
                    for (var r = 0u; r < C; r += 4u) {
                        let k0 = st_t[r * 16u + q4];
                        let k1 = st_t[(r + 1u) * 16u + q4];
                        let k2 = st_t[(r + 2u) * 16u + q4];
                        let k3 = st_t[(r + 3u) * 16u + q4];
                        let u0 = st_u[r * 16u + cg];
                        let u1 = st_u[(r + 1u) * 16u + cg];
                        let u2 = st_u[(r + 2u) * 16u + cg];
                        let u3 = st_u[(r + 3u) * 16u + cg];
                        s0 += k0.x * u0;
                        s1 += k0.y * u0;
                        s2 += k0.z * u0;
                        s3 += k0.w * u0;
                        s0 += k1.x * u1;
                        s1 += k1.y * u1;
                        s2 += k1.z * u1;
                        s3 += k1.w * u1;
                        s0 += k2.x * u2;
                        s1 += k2.y * u2;
                        s2 += k2.z * u2;
                        s3 += k2.w * u2;
                        s0 += k3.x * u3;
                        s1 += k3.y * u3;
                        s2 += k3.z * u3;
                        s3 += k3.w * u3;
                    }
                    st_s[ch0 * 16u + cg] = s0;
                    st_s[(ch0 + 1u) * 16u + cg] = s1;
                    st_s[(ch0 + 2u) * 16u + cg] = s2;
                    st_s[(ch0 + 3u) * 16u + cg] = s3;
                }
            }
        }
    }
    workgroupBarrier();
    if (live) {
        for (var c = q4; c < p.dk; c += 16u) {
            let x = st_s[c * 16u + cg];
            let at = h * kv + c * p.dk + col;
            state[at] = x.x;
            state[at + 1u] = x.y;
        }
    }
}

// ---------------------------------------------------------------------------------------
// Shared by the register state pass below: workgroup size, slice shapes and their loads.
// vec4 views of the buffers the register state passes and kda_chunk_intra's phase 4 read or
// write whole quads of (K and V are multiples of 16, so every row starts on a quad): 128-bit
// loads and stores (on the H200 the state pass 3.86 -> 3.80 ms, intra 2.77 -> 2.67 ms;
// kda_chunk_out got slower reading hs and u this way, with 256 and with 128 threads).
@group(0) @binding(6) var<storage, read_write> w4: array<vec4<f32>>;
@group(0) @binding(7) var<storage, read_write> u4: array<vec4<f32>>;
@group(0) @binding(9) var<storage, read_write> kg4: array<vec4<f32>>;
@group(0) @binding(8) var<storage, read_write> qg4: array<vec4<f32>>;
@group(0) @binding(13) var<storage, read_write> hs4: array<vec4<f32>>;

const RWG: u32 = 128u;           // threads of a register state-pass workgroup
const RWC: u32 = RWG / 8u;       // channels per staged w slice (2 vec4 per thread)
const RKR: u32 = RWG / 8u;       // rows per staged kg slice (RKR x 128 channels: 4 vec4 per thread)

// Global loads of stage s of chunk n (s < nsu: w slice s, else kg slice s - nsu); zeros past
// the last row, past K and past the last chunk.
fn rs_fetch(n: u32, s: u32, nsu: u32, h: u32, lid: u32) -> array<vec4<f32>, 4> {
    var out: array<vec4<f32>, 4>;
    if (n >= p.nchunks) {
        return out;
    }
    let hk = p.heads * p.dk;
    let t0 = n * C;
    let nv = rows_in(n);
    if (s < nsu) {
        let nq = RWC / 4u;
        for (var i = 0u; i < 2u; i++) {
            let e = lid + i * RWG;
            let r = e / nq;
            let ch = s * RWC + 4u * (e % nq);
            if (r < nv && ch < p.dk) {
                out[i] = w4[((t0 + r) * hk + h * p.dk + ch) / 4u];
            }
        }
    } else {
        let r0 = (s - nsu) * RKR;
        for (var i = 0u; i < 4u; i++) {
            let e = lid + i * RWG;
            let r = r0 + e / 32u;
            let ch = 4u * (e % 32u);
            if (r < nv && ch < p.dk) {
                out[i] = kg4[((t0 + r) * hk + h * p.dk + ch) / 4u];
            }
        }
    }
    return out;
}

// ---------------------------------------------------------------------------------------
// kda_chunk_state_r32: the state pass with S in registers, 32 value columns per workgroup of
// RWG = 128 threads (K <= 128): 4 workgroups per head, so K3.1's 96 heads fit one wave at 3 per
// SM (167 registers on the H200). It replaced a 16-column form with 4 x 4 tiles (768 workgroups,
// two waves, 2 instead of 1.5 bytes of workgroup memory per FMA, twice the w / kg re-reads):
// 3.79 -> 2.80 ms at T = 8192 x 96 heads.
//   Thread (chg = lid / 8, cq = lid % 8) keeps S[8 chg .. 8 chg + 7, columns 4 cq .. + 3] as
//   eight vec4 for the whole pass.
//   U stages (ceil(K / 16) w slices of [64 rows, 16 channels], RWC): the slice's 16 rows of
//   S_n come from their owners (16 threads) beside it; U = u - w S_n as 8 x 4
//   tiles (rows 8 rg .., columns 4 cq ..), the K reduction split between the two halves of the
//   workgroup, which then swap partial sums for half of each tile's rows through rt_u.
//   S stages: S = diag(e^Gamma_last) S_n + kg^T U, kg in slices of 16 rows x 128 channels.
// 16 KiB of workgroup memory; one stage's global loads in flight (two stages ahead, or fewer
// barriers through a second w buffer, measured slower on the H200).
const R32_COLS: u32 = 32u;
const R32_CQ: u32 = 8u;           // column quads
// U stages: [0, 256) the w slice [64 rows, 4 channel quads] (rt_wq), [256, 384) the slice's
// S_n rows [16 channels, 8 column quads]; S stages: the kg slice [16 rows, 32 channel quads].
var<workgroup> rt_a: array<vec4<f32>, 512>;
// U [64 rows, 8 column quads]: the halves' partial sums, then U.
var<workgroup> rt_u: array<vec4<f32>, 512>;
@group(0) @binding(11) var<storage, read_write> state4: array<vec4<f32>>;

// Slot of (row, channel quad) of the w slice: the quad XOR (row / 8) % 4, so that the four row
// groups one warp reads in one step (rows 8 apart) fall on different banks.
fn rt_wq(row: u32, quad: u32) -> u32 {
    return row * 4u + (quad ^ ((row / 8u) % 4u));
}

@compute @workgroup_size(RWG)
fn kda_chunk_state_r32(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let tiles = (p.dk + R32_COLS - 1u) / R32_COLS;
    let id = wg.x + wg.y * nwg.x;
    if (id >= p.heads * tiles) {
        return;
    }
    let h = id / tiles;
    let v0 = (id % tiles) * R32_COLS;
    let hk = p.heads * p.dk;
    let kv = p.dk * p.dk;
    let dk4 = p.dk / 4u;
    let cq = lid % R32_CQ;
    let chg = lid / R32_CQ;        // S: channels 8 chg .. 8 chg + 7 (chg < 16)
    let ch = 8u * chg;
    let col = v0 + 4u * cq;
    let live = col < p.dk;         // K is a multiple of 16: whole quads, whole channel octets
    let own = live && ch < p.dk;
    let half = lid / 64u;          // U: which half of each w slice's channels
    let rg = (lid % 64u) / R32_CQ; // U: rows 8 rg .. 8 rg + 7
    var s0 = vec4<f32>(0.0);
    var s1 = vec4<f32>(0.0);
    var s2 = vec4<f32>(0.0);
    var s3 = vec4<f32>(0.0);
    var s4 = vec4<f32>(0.0);
    var s5 = vec4<f32>(0.0);
    var s6 = vec4<f32>(0.0);
    var s7 = vec4<f32>(0.0);
    let sbase = (h * kv + ch * p.dk + col) / 4u;
    if (own) {
        s0 = state4[sbase];
        s1 = state4[sbase + dk4];
        s2 = state4[sbase + 2u * dk4];
        s3 = state4[sbase + 3u * dk4];
        s4 = state4[sbase + 4u * dk4];
        s5 = state4[sbase + 5u * dk4];
        s6 = state4[sbase + 6u * dk4];
        s7 = state4[sbase + 7u * dk4];
    }
    let nsu = (p.dk + RWC - 1u) / RWC;
    let nss = C / RKR;
    var pf = rs_fetch(0u, 0u, nsu, h, lid);
    for (var n = 0u; n < p.nchunks; n++) {
        let t0 = n * C;
        let nv = rows_in(n);
        if (own) {
            // S_n for kda_chunk_out.
            let at = ((n * p.heads + h) * kv + ch * p.dk + col) / 4u;
            hs4[at] = s0;
            hs4[at + dk4] = s1;
            hs4[at + 2u * dk4] = s2;
            hs4[at + 3u * dk4] = s3;
            hs4[at + 4u * dk4] = s4;
            hs4[at + 5u * dk4] = s5;
            hs4[at + 6u * dk4] = s6;
            hs4[at + 7u * dk4] = s7;
        }
        var a0 = vec4<f32>(0.0);
        var a1 = vec4<f32>(0.0);
        var a2 = vec4<f32>(0.0);
        var a3 = vec4<f32>(0.0);
        var a4 = vec4<f32>(0.0);
        var a5 = vec4<f32>(0.0);
        var a6 = vec4<f32>(0.0);
        var a7 = vec4<f32>(0.0);
        var uin: array<vec4<f32>, 4>;
        var dlo = vec4<f32>(1.0);
        var dhi = vec4<f32>(1.0);
        let glast = (t0 + nv - 1u) * hk + h * p.dk;
        // This half's own rows of the tile (the other half's partial sums come through rt_u).
        let mine = 8u * rg + 4u * half;
        for (var s = 0u; s < nsu; s++) {
            for (var i = 0u; i < 2u; i++) {
                let e = lid + i * RWG;
                rt_a[rt_wq(e / 4u, e % 4u)] = pf[i];
            }
            if (chg / 2u == s) {
                let sb = 256u + 8u * (chg % 2u) * R32_CQ + cq;
                rt_a[sb] = s0;
                rt_a[sb + R32_CQ] = s1;
                rt_a[sb + 2u * R32_CQ] = s2;
                rt_a[sb + 3u * R32_CQ] = s3;
                rt_a[sb + 4u * R32_CQ] = s4;
                rt_a[sb + 5u * R32_CQ] = s5;
                rt_a[sb + 6u * R32_CQ] = s6;
                rt_a[sb + 7u * R32_CQ] = s7;
            }
            workgroupBarrier();
            if (s + 1u < nsu) {
                pf = rs_fetch(n, s + 1u, nsu, h, lid);
            } else {
                pf = rs_fetch(n, nsu, nsu, h, lid);
                // u of this half's rows and the decay, a stage before their use.
                if (live) {
                    for (var ii = 0u; ii < 4u; ii++) {
                        let r = mine + ii;
                        if (r < nv) {
                            uin[ii] = u4[((t0 + r) * hk + h * p.dk + col) / 4u];
                        }
                    }
                }
                if (own) {
                    let ga = glast + ch;
                    dlo = exp(vec4<f32>(gam[ga], gam[ga + 1u], gam[ga + 2u], gam[ga + 3u]));
                    dhi = exp(vec4<f32>(gam[ga + 4u], gam[ga + 5u], gam[ga + 6u], gam[ga + 7u]));
                }
            }
            for (var j = 0u; j < 2u; j++) {
                let qd = 2u * half + j;
                let b0 = rt_a[256u + (4u * qd) * R32_CQ + cq];
                let b1 = rt_a[256u + (4u * qd + 1u) * R32_CQ + cq];
                let b2 = rt_a[256u + (4u * qd + 2u) * R32_CQ + cq];
                let b3 = rt_a[256u + (4u * qd + 3u) * R32_CQ + cq];
                let w0 = rt_a[rt_wq(8u * rg, qd)];
                let w1 = rt_a[rt_wq(8u * rg + 1u, qd)];
                let w2 = rt_a[rt_wq(8u * rg + 2u, qd)];
                let w3 = rt_a[rt_wq(8u * rg + 3u, qd)];
                let w4_ = rt_a[rt_wq(8u * rg + 4u, qd)];
                let w5 = rt_a[rt_wq(8u * rg + 5u, qd)];
                let w6 = rt_a[rt_wq(8u * rg + 6u, qd)];
                let w7 = rt_a[rt_wq(8u * rg + 7u, qd)];
                a0 += w0.x * b0 + w0.y * b1 + w0.z * b2 + w0.w * b3;
                a1 += w1.x * b0 + w1.y * b1 + w1.z * b2 + w1.w * b3;
                a2 += w2.x * b0 + w2.y * b1 + w2.z * b2 + w2.w * b3;
                a3 += w3.x * b0 + w3.y * b1 + w3.z * b2 + w3.w * b3;
                a4 += w4_.x * b0 + w4_.y * b1 + w4_.z * b2 + w4_.w * b3;
                a5 += w5.x * b0 + w5.y * b1 + w5.z * b2 + w5.w * b3;
                a6 += w6.x * b0 + w6.y * b1 + w6.z * b2 + w6.w * b3;
                a7 += w7.x * b0 + w7.y * b1 + w7.z * b2 + w7.w * b3;
            }
            if (s + 1u == nsu) {
                // The other half's rows of this tile: half 0 hands over rows 4..7, half 1 rows 0..3.
                let other = (8u * rg + 4u * (1u - half)) * R32_CQ + cq;
                rt_u[other] = select(a4, a0, half == 1u);
                rt_u[other + R32_CQ] = select(a5, a1, half == 1u);
                rt_u[other + 2u * R32_CQ] = select(a6, a2, half == 1u);
                rt_u[other + 3u * R32_CQ] = select(a7, a3, half == 1u);
            }
            workgroupBarrier();
        }
        // U = u - (both halves' sums) on this half's rows (zero past the end and off the matrix).
        for (var ii = 0u; ii < 4u; ii++) {
            let r = mine + ii;
            var acc = select(a0, a4, half == 1u);
            if (ii == 1u) {
                acc = select(a1, a5, half == 1u);
            } else if (ii == 2u) {
                acc = select(a2, a6, half == 1u);
            } else if (ii == 3u) {
                acc = select(a3, a7, half == 1u);
            }
            let slot = r * R32_CQ + cq;
            var uu = vec4<f32>(0.0);
            if (r < nv && live) {
                uu = uin[ii] - (acc + rt_u[slot]);
                u4[((t0 + r) * hk + h * p.dk + col) / 4u] = uu;
            }
            rt_u[slot] = uu;
        }
        s0 *= dlo.x;
        s1 *= dlo.y;
        s2 *= dlo.z;
        s3 *= dlo.w;
        s4 *= dhi.x;
        s5 *= dhi.y;
        s6 *= dhi.z;
        s7 *= dhi.w;
        // S stages: kg rows s RKR .. + RKR - 1 (zero past the end: a constant trip count).
        for (var s = 0u; s < nss; s++) {
            for (var i = 0u; i < 4u; i++) {
                rt_a[lid + i * RWG] = pf[i];
            }
            workgroupBarrier();
            if (s + 1u < nss) {
                pf = rs_fetch(n, nsu + s + 1u, nsu, h, lid);
            } else {
                pf = rs_fetch(n + 1u, 0u, nsu, h, lid);
            }
            let rb = s * RKR;
            for (var r = 0u; r < RKR; r++) {
                let k0 = rt_a[r * 32u + 2u * chg];
                let k1 = rt_a[r * 32u + 2u * chg + 1u];
                let uu = rt_u[(rb + r) * R32_CQ + cq];
                s0 += k0.x * uu;
                s1 += k0.y * uu;
                s2 += k0.z * uu;
                s3 += k0.w * uu;
                s4 += k1.x * uu;
                s5 += k1.y * uu;
                s6 += k1.z * uu;
                s7 += k1.w * uu;
            }
            workgroupBarrier();
        }
    }
    if (own) {
        state4[sbase] = s0;
        state4[sbase + dk4] = s1;
        state4[sbase + 2u * dk4] = s2;
        state4[sbase + 3u * dk4] = s3;
        state4[sbase + 4u * dk4] = s4;
        state4[sbase + 5u * dk4] = s5;
        state4[sbase + 6u * dk4] = s6;
        state4[sbase + 7u * dk4] = s7;
    }
}

// ---------------------------------------------------------------------------------------
// kda_chunk_state_b: S in registers, broadcast operands, 32 columns per workgroup of 64 threads,
// 16 KiB (lib/kda_state_b.wgsl). On the H200 16 columns (32 threads, 8 KiB) were slower, and so
// were slices of 4 or 16 rows (12 KiB, 24 KiB), see the include.
#include "lib/kda_state_b.wgsl" BC=32u BR=8u

// ---------------------------------------------------------------------------------------
const LANES: u32 = 16u;   // value columns per kda_chunk_state16 workgroup
const GROUPS: u32 = 16u;  // row groups per kda_chunk_state16 workgroup
var<workgroup> sh_s: array<f32, 4096>;   // [K, LANES] state tile, K <= 256
var<workgroup> sh_u: array<f32, 1024>;   // [C, LANES] U of the current chunk


// kda_chunk_state16: the state pass for K > 128 (kda_chunk_state holds at most 128 rows of S
// in workgroup memory): one workgroup per (head, 16 value columns), sequential over chunks,
// w and kg read from global memory in the inner loops; same outputs as kda_chunk_state.
@compute @workgroup_size(256)
fn kda_chunk_state16(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let tiles = (p.dk + LANES - 1u) / LANES;
    let id = wg.x + wg.y * nwg.x;
    if (id >= p.heads * tiles) {
        return;
    }
    let h = id / tiles;
    let tile = id % tiles;
    let lane = lid % LANES;
    let grp = lid / LANES;
    let col = tile * LANES + lane;
    let live = col < p.dk;
    let hk = p.heads * p.dk;
    let kv = p.dk * p.dk;
    let sbase = h * kv + col;
    for (var c = grp; c < p.dk; c += GROUPS) {
        sh_s[c * LANES + lane] = select(0.0, state[sbase + c * p.dk], live);
    }
    workgroupBarrier();
    for (var n = 0u; n < p.nchunks; n++) {
        let t0 = n * C;
        let nv = rows_in(n);
        if (live) {
            let hb = (n * p.heads + h) * kv + col;
            for (var c = grp; c < p.dk; c += GROUPS) {
                hs[hb + c * p.dk] = sh_s[c * LANES + lane];
            }
        }
        // U = u - w S for rows grp, grp + GROUPS, ...
        for (var i = 0u; i < C / GROUPS; i++) {
            let r = grp + i * GROUPS;
            var au = 0.0;
            if (r < nv) {
                let row = (t0 + r) * hk + h * p.dk;
                for (var c = 0u; c < p.dk; c++) {
                    au += w[row + c] * sh_s[c * LANES + lane];
                }
                if (live) {
                    au = u[row + col] - au;
                    u[row + col] = au;
                } else {
                    au = 0.0;
                }
            }
            sh_u[r * LANES + lane] = au;
        }
        workgroupBarrier();
        // S = diag(e^Gamma_last) S + kg^T U (each thread owns its own rows of S).
        let glast = (t0 + nv - 1u) * hk + h * p.dk;
        for (var c = grp; c < p.dk; c += GROUPS) {
            var acc = sh_s[c * LANES + lane] * exp(gam[glast + c]);
            for (var rr = 0u; rr < nv; rr++) {
                acc += kg[(t0 + rr) * hk + h * p.dk + c] * sh_u[rr * LANES + lane];
            }
            sh_s[c * LANES + lane] = acc;
        }
        workgroupBarrier();
    }
    if (live) {
        for (var c = grp; c < p.dk; c += GROUPS) {
            state[sbase + c * p.dk] = sh_s[c * LANES + lane];
        }
    }
}

// ---------------------------------------------------------------------------------------
// kda_chunk_out: one workgroup per (chunk, head, tile of OVT columns), all in parallel:
// O = qg S_n + A_qk U = [qg | A_qk] [S_n ; U], inner dimension K + C in slices of OKS.
// 128 threads, each an 8 x 4 tile of O (three staged vec4 per 32 FMAs): 1.43 -> 1.34 ms on
// the H200 at T = 8192 x 96 heads against 256 threads of 4 x 4 tiles.
const OVT: u32 = 64u;     // value columns per output workgroup (16 quads)
const OKS: u32 = 32u;     // inner slice
var<workgroup> so_a: array<vec4<f32>, 512>;  // [OKS, 16]: quads of 4 rows of the left operand, swizzled (so_aq)
var<workgroup> so_b: array<vec4<f32>, 512>;  // [OKS, 16]: quads of 4 columns of the right operand

// Item e of slice s of kda_chunk_out's left operand: column kk = e % OKS of rows 4 rq .. 4 rq + 3,
// rq = e / OKS (qg for s < nks, then A_qk).
fn out_fetch_a(s: u32, e: u32, nks: u32, t0: u32, nv: u32, hk: u32, h: u32, abase: u32) -> vec4<f32> {
    let kk = e % OKS;
    let r = 4u * (e / OKS);
    var x = vec4<f32>(0.0);
    if (s < nks) {
        let ch = s * OKS + kk;
        if (ch < p.dk) {
            let at = (t0 + r) * hk + h * p.dk + ch;
            if (r < nv) {
                x.x = qg[at];
            }
            if (r + 1u < nv) {
                x.y = qg[at + hk];
            }
            if (r + 2u < nv) {
                x.z = qg[at + 2u * hk];
            }
            if (r + 3u < nv) {
                x.w = qg[at + 3u * hk];
            }
        }
    } else {
        let at = abase + r * C + (s - nks) * OKS + kk;
        x = vec4<f32>(aqk[at], aqk[at + C], aqk[at + 2u * C], aqk[at + 3u * C]);
    }
    return x;
}

// Item e of slice s of the right operand: row kr = e / 16, columns v0 + 4 (e % 16) .. + 3 (S_n
// for s < nks, then U).
fn out_fetch_b(s: u32, e: u32, nks: u32, t0: u32, nv: u32, hk: u32, h: u32, nh: u32, v0: u32) -> vec4<f32> {
    let kr = e / 16u;
    let col = v0 + 4u * (e % 16u);
    var y = vec4<f32>(0.0);
    if (col < p.dk) {
        if (s < nks) {
            let ch = s * OKS + kr;
            if (ch < p.dk) {
                let at = nh * p.dk * p.dk + ch * p.dk + col;
                y = vec4<f32>(hs[at], hs[at + 1u], hs[at + 2u], hs[at + 3u]);
            }
        } else {
            let jr = (s - nks) * OKS + kr;
            if (jr < nv) {
                let at = (t0 + jr) * hk + h * p.dk + col;
                y = vec4<f32>(u[at], u[at + 1u], u[at + 2u], u[at + 3u]);
            }
        }
    }
    return y;
}

// Slot of (inner index kk, row quad rq) in so_a: the quad XOR kk, so that a warp's stores (32
// consecutive kk of one rq) spread over the banks without a padded row.
fn so_aq(kk: u32, rq: u32) -> u32 {
    return kk * 16u + (rq ^ (kk % 16u));
}

@compute @workgroup_size(128)
fn kda_chunk_out(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let tiles = (p.dk + OVT - 1u) / OVT;
    let id = wg.x + wg.y * nwg.x;
    if (id >= p.nchunks * p.heads * tiles) {
        return;
    }
    let v0 = (id % tiles) * OVT;
    let nh = id / tiles;
    let n = nh / p.heads;
    let h = nh % p.heads;
    let hk = p.heads * p.dk;
    let t0 = n * C;
    let nv = rows_in(n);
    let abase = nh * C * C;
    let rg = lid / 16u;   // rows 8 rg .. 8 rg + 7
    let cg = lid % 16u;
    let nks = (p.dk + OKS - 1u) / OKS;
    var acc0 = vec4<f32>(0.0);
    var acc1 = vec4<f32>(0.0);
    var acc2 = vec4<f32>(0.0);
    var acc3 = vec4<f32>(0.0);
    var acc4 = vec4<f32>(0.0);
    var acc5 = vec4<f32>(0.0);
    var acc6 = vec4<f32>(0.0);
    var acc7 = vec4<f32>(0.0);
    let ns = nks + C / OKS;
    var xa: array<vec4<f32>, 4>;
    var yb: array<vec4<f32>, 4>;
    for (var i = 0u; i < 4u; i++) {
        xa[i] = out_fetch_a(0u, lid + i * 128u, nks, t0, nv, hk, h, abase);
        yb[i] = out_fetch_b(0u, lid + i * 128u, nks, t0, nv, hk, h, nh, v0);
    }
    for (var s = 0u; s < ns; s++) {
        for (var i = 0u; i < 4u; i++) {
            let e = lid + i * 128u;
            so_a[so_aq(e % OKS, e / OKS)] = xa[i];
            so_b[e] = yb[i];
        }
        workgroupBarrier();
        if (s + 1u < ns) {
            for (var i = 0u; i < 4u; i++) {
                xa[i] = out_fetch_a(s + 1u, lid + i * 128u, nks, t0, nv, hk, h, abase);
                yb[i] = out_fetch_b(s + 1u, lid + i * 128u, nks, t0, nv, hk, h, nh, v0);
            }
        }
        for (var kk = 0u; kk < OKS; kk++) {
            let x0 = so_a[so_aq(kk, 2u * rg)];
            let x1 = so_a[so_aq(kk, 2u * rg + 1u)];
            let b = so_b[kk * 16u + cg];
            acc0 += x0.x * b;
            acc1 += x0.y * b;
            acc2 += x0.z * b;
            acc3 += x0.w * b;
            acc4 += x1.x * b;
            acc5 += x1.y * b;
            acc6 += x1.z * b;
            acc7 += x1.w * b;
        }
        workgroupBarrier();
    }
    let col = v0 + 4u * cg;
    if (col < p.dk) {
        let r0 = 8u * rg;
        let at0 = (t0 + r0) * hk + h * p.dk + col;
        for (var ii = 0u; ii < 8u; ii++) {
            if (r0 + ii < nv) {
                var y = acc0;
                switch ii {
                    case 1u: { y = acc1; }
                    case 2u: { y = acc2; }
                    case 3u: { y = acc3; }
                    case 4u: { y = acc4; }
                    case 5u: { y = acc5; }
                    case 6u: { y = acc6; }
                    case 7u: { y = acc7; }
                    default: {}
                }
                let at = at0 + ii * hk;
                o[at] = y.x;
                o[at + 1u] = y.y;
                o[at + 2u] = y.z;
                o[at + 3u] = y.w;
            }
        }
    }
}
