// Chunked (WY/UT) KDA prefill, spec 4.4: chunks of C = 64 rows, all in f32.
//   kda_chunk_cumsum: Gamma = within-chunk cumulative sum of g (in place).
//   kda_chunk_intra:  per (chunk, head): A_kk, A_qk (sub-chunks of 16: pairwise exponents on
//                     the diagonal blocks, the first row of the row's sub-chunk as reference
//                     off the diagonal; never e^-Gamma alone), then the unit lower-triangular
//                     solve (I + A_kk) X = diag(beta) [K e^Gamma | V] by forward substitution, giving w and u; also qg = q e^Gamma and
//                     kg = k e^(Gamma_last - Gamma).
//   kda_chunk_state:  per (head, tile of value columns), sequential over chunks:
//                     keep S_n; U = u - w S_n;  S = diag(e^Gamma_last) S_n + kg^T U.
//   kda_chunk_out:    per (chunk, head, tile), in parallel: O = qg S_n + A_qk U.
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
// HALF_OUT variant of kda_chunk_intra (for the coop scan): w, qg, kg as f16 pairs instead.
@group(0) @binding(14) var<storage, read_write> w16: array<u32>;  // [T, H, K/2] packed f16
@group(0) @binding(15) var<storage, read_write> qg16: array<u32>; // [T, H, K/2]
@group(0) @binding(16) var<storage, read_write> kg16: array<u32>; // [T, H, K/2]
@group(0) @binding(17) var<storage, read_write> aqk16: array<u32>; // [N, H, C, C/2]

// kda_chunk_intra writes w, qg, kg, A_qk as packed f16 (bindings 14-17) instead of f32.
override HALF_OUT: bool = false;

// IEEE binary16 bits of x, round to nearest even (subnormals, overflow to inf). By hand:
// naga's pack2x16float needs SHADER_FLOAT16_IN_FLOAT32, which not every backend has.
fn f16_bits(x: f32) -> u32 {
    let b = bitcast<u32>(x);
    let sign = (b >> 16u) & 0x8000u;
    let a = b & 0x7fffffffu;
    if (a >= 0x477ff000u) {
        return sign | select(0x7c00u, 0x7e00u, a > 0x7f800000u);
    }
    if (a < 0x38800000u) {
        return sign | u32(round(bitcast<f32>(a) * 16777216.0));
    }
    return sign | ((a + 0xfffu + ((a >> 13u) & 1u) - 0x38000000u) >> 13u);
}

fn pack_f16x2(x: vec2<f32>) -> u32 {
    return f16_bits(x.x) | (f16_bits(x.y) << 16u);
}

const WG: u32 = 256u;
const C: u32 = 64u;       // chunk rows
const KT: u32 = 16u;      // channels per staged tile in kda_chunk_intra
// 16 columns x 16 row groups: 768 state-pass workgroups at 96 heads x 128 (one wave on a
// 132-SM GPU), each thread with a short serial chain (4 rows of U, K/16 rows of S).
const LANES: u32 = 16u;   // value columns per state / output workgroup
const GROUPS: u32 = 16u;  // row groups per state / output workgroup
const KMAX: u32 = 256u;

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

var<workgroup> sh_akk: array<f32, 4096>;     // [C, C] beta_r * A_kk, strictly lower
// One workgroup array, two lives: while A_kk and A_qk are accumulated it holds the staged
// channel tiles (offsets O_*), then M = (I + A_kk)^-1 [C, C] at 0 and a block product at O_T.
var<workgroup> sh_big: array<f32, 7424>;
const O_TK: u32 = 0u;        // [C, KT] k
const O_TQ: u32 = 1024u;     // [C, KT] q
const O_TG: u32 = 2048u;     // [C, KT] Gamma
const O_LK: u32 = 3072u;     // [C, KT] k_r e^(Gamma_r - Gamma_n(r)), n(r) = first row of r's sub-chunk
const O_LQ: u32 = 4096u;     // [C, KT] q_r e^(Gamma_r - Gamma_n(r))
const O_RK: u32 = 5120u;     // [3, 48, KT] k_j e^(Gamma_n - Gamma_j), n = 16, 32, 48, j < n
const O_T: u32 = 4096u;      // [3, 16, 16] T_ab = sum_m A_am M_mb of one block distance
var<workgroup> sh_beta: array<f32, 64>;

const SUB: u32 = 16u;     // sub-chunk rows

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
    if (lid < C) {
        sh_beta[lid] = select(0.0, beta[(t0 + lid) * p.heads + h], lid < nv);
    }
    // Thread owns row r and columns j = jq, jq + 4, ...
    let r = lid / 4u;
    let jq = lid % 4u;
    var akk: array<f32, 16>;
    var aq: array<f32, 16>;
    for (var c0 = 0u; c0 < p.dk; c0 += KT) {
        for (var e = lid; e < C * KT; e += WG) {
            let rr = e / KT;
            let cc = e % KT;
            let at = (t0 + rr) * hk + h * p.dk + c0 + cc;
            let ok = rr < nv;
            sh_big[O_TK + e] = select(0.0, k[at], ok);
            sh_big[O_TQ + e] = select(0.0, q[at], ok);
            sh_big[O_TG + e] = select(0.0, gam[at], ok);
        }
        workgroupBarrier();
        // Sub-chunk references (spec 4.4): both exponents <= 0, so the off-diagonal blocks
        // are plain dot products of pre-scaled rows, exact in range.
        for (var e = lid; e < C * KT; e += WG) {
            let rr = e / KT;
            let cc = e % KT;
            let gn = sh_big[O_TG + (rr / SUB) * SUB * KT + cc];
            let sc = select(0.0, exp(sh_big[O_TG + e] - gn), rr < nv);
            sh_big[O_LK + e] = sh_big[O_TK + e] * sc;
            sh_big[O_LQ + e] = sh_big[O_TQ + e] * sc;
        }
        for (var e = lid; e < 3u * 48u * KT; e += WG) {
            let a = e / (48u * KT) + 1u;
            let jj = (e / KT) % 48u;
            let cc = e % KT;
            let n0 = a * SUB;
            var val = 0.0;
            if (jj < n0 && n0 < nv) {
                val = sh_big[O_TK + jj * KT + cc] * exp(sh_big[O_TG + n0 * KT + cc] - sh_big[O_TG + jj * KT + cc]);
            }
            sh_big[O_RK + e] = val;
        }
        workgroupBarrier();
        if (r < nv) {
            let a = r / SUB;
            // This thread's row of the pre-scaled tiles, read once per tile (not once per j).
            var lkr: array<f32, KT>;
            var lqr: array<f32, KT>;
            for (var cc = 0u; cc < KT; cc++) {
                lkr[cc] = sh_big[O_LK + r * KT + cc];
                lqr[cc] = sh_big[O_LQ + r * KT + cc];
            }
            for (var m = 0u; m < 16u; m++) {
                let j = jq + 4u * m;
                if (j <= r) {
                    var sk = 0.0;
                    var sq = 0.0;
                    if (j / SUB == a) {
                        for (var cc = 0u; cc < KT; cc++) {
                            // Diagonal block: pairwise exponent Gamma_r - Gamma_j <= 0.
                            let kj = sh_big[O_TK + j * KT + cc] * exp(sh_big[O_TG + r * KT + cc] - sh_big[O_TG + j * KT + cc]);
                            sk += sh_big[O_TK + r * KT + cc] * kj;
                            sq += sh_big[O_TQ + r * KT + cc] * kj;
                        }
                    } else {
                        let rb = ((a - 1u) * 48u + j) * KT;
                        for (var cc = 0u; cc < KT; cc++) {
                            let kj = sh_big[O_RK + rb + cc];
                            sk += lkr[cc] * kj;
                            sq += lqr[cc] * kj;
                        }
                    }
                    akk[m] += sk;
                    aq[m] += sq;
                }
            }
        }
        workgroupBarrier();
    }
    let abase = id * C * C;
    for (var m = 0u; m < 16u; m++) {
        let j = jq + 4u * m;
        let live = r < nv && j <= r;
        sh_akk[r * C + j] = select(0.0, sh_beta[r] * akk[m], live && j < r);
        if (HALF_OUT) {
            sh_big[r * C + j] = select(0.0, aq[m], live);
        } else {
            aqk[abase + r * C + j] = select(0.0, aq[m], live);
        }
    }
    workgroupBarrier();
    if (HALF_OUT) {
        // A_qk leaves as f16 pairs (adjacent columns come from different threads: staged).
        for (var e = lid; e < C * C / 2u; e += WG) {
            aqk16[abase / 2u + e] = pack_f16x2(vec2<f32>(sh_big[2u * e], sh_big[2u * e + 1u]));
        }
        workgroupBarrier();
    }
    // M = (I + A)^-1 (A = sh_akk, strictly lower, rows scaled by beta), blockwise in f32 (spec
    // 4.4): the 16x16 diagonal blocks by forward substitution, then the blocks at distance
    // d = 1, 2, 3 below the diagonal: M_ab = -M_aa sum_{m=b}^{a-1} A_am M_mb.
    for (var e = lid; e < C * C; e += WG) {
        sh_big[e] = select(0.0, 1.0, e / C == e % C);
    }
    workgroupBarrier();
    if (lid < C) {
        let r0 = (lid / SUB) * SUB;
        let j = lid % SUB;
        for (var i = j + 1u; i < SUB; i++) {
            var acc = -sh_akk[(r0 + i) * C + r0 + j];
            for (var m = j + 1u; m < i; m++) {
                acc -= sh_akk[(r0 + i) * C + r0 + m] * sh_big[(r0 + m) * C + r0 + j];
            }
            sh_big[(r0 + i) * C + r0 + j] = acc;
        }
    }
    workgroupBarrier();
    for (var d = 1u; d < C / SUB; d++) {
        let nb = C / SUB - d;
        for (var e = lid; e < nb * SUB * SUB; e += WG) {
            let b = e / (SUB * SUB);
            let a = b + d;
            let i = (e / SUB) % SUB;
            let j = e % SUB;
            var acc = 0.0;
            for (var m = b * SUB; m < a * SUB; m++) {
                acc += sh_akk[(a * SUB + i) * C + m] * sh_big[m * C + b * SUB + j];
            }
            sh_big[O_T + e] = acc;
        }
        workgroupBarrier();
        for (var e = lid; e < nb * SUB * SUB; e += WG) {
            let b = e / (SUB * SUB);
            let a = b + d;
            let i = (e / SUB) % SUB;
            let j = e % SUB;
            var acc = 0.0;
            for (var m = 0u; m <= i; m++) {
                acc += sh_big[(a * SUB + i) * C + a * SUB + m] * sh_big[O_T + b * SUB * SUB + m * SUB + j];
            }
            sh_big[(a * SUB + i) * C + b * SUB + j] = -acc;
        }
        workgroupBarrier();
    }
    // [w | u] = M diag(beta) [K e^Gamma | V], one column per thread: the column's rows are
    // loaded up front (independent loads), then a dense lower-triangular product; qg and kg
    // on the way.
    let glast = (t0 + nv - 1u) * hk + h * p.dk;
    if (HALF_OUT) {
        // Items 0 .. V-1: columns of u (f32, as below); V .. V + K/2 - 1: pairs of adjacent
        // key channels, so w, qg and kg leave as packed f16 pairs.
        for (var item = lid; item < p.dk + p.dk / 2u; item += WG) {
            if (item < p.dk) {
                var bcol: array<f32, 64>;
                for (var rr = 0u; rr < C; rr++) {
                    var x = 0.0;
                    if (rr < nv) {
                        x = v[(t0 + rr) * hk + h * p.dk + item];
                    }
                    bcol[rr] = sh_beta[rr] * x;
                }
                for (var rr = 0u; rr < nv; rr++) {
                    var acc = 0.0;
                    for (var mb = 0u; mb < C / SUB; mb++) {
                        if (mb * SUB <= rr) {
                            for (var mi = 0u; mi < SUB; mi++) {
                                acc += sh_big[rr * C + mb * SUB + mi] * bcol[mb * SUB + mi];
                            }
                        }
                    }
                    u[(t0 + rr) * hk + h * p.dk + item] = acc;
                }
            } else {
                let c0 = 2u * (item - p.dk);
                var b0: array<f32, 64>;
                var b1: array<f32, 64>;
                let gl0 = gam[glast + c0];
                let gl1 = gam[glast + c0 + 1u];
                for (var rr = 0u; rr < C; rr++) {
                    var x = vec2<f32>(0.0);
                    if (rr < nv) {
                        let at = (t0 + rr) * hk + h * p.dk + c0;
                        let gr = vec2<f32>(gam[at], gam[at + 1u]);
                        let kv = vec2<f32>(k[at], k[at + 1u]);
                        let eg = exp(gr);
                        x = kv * eg;
                        qg16[at / 2u] = pack_f16x2(vec2<f32>(q[at], q[at + 1u]) * eg);
                        kg16[at / 2u] = pack_f16x2(kv * exp(vec2<f32>(gl0, gl1) - gr));
                    }
                    b0[rr] = sh_beta[rr] * x.x;
                    b1[rr] = sh_beta[rr] * x.y;
                }
                for (var rr = 0u; rr < nv; rr++) {
                    var acc = vec2<f32>(0.0);
                    for (var mb = 0u; mb < C / SUB; mb++) {
                        if (mb * SUB <= rr) {
                            for (var mi = 0u; mi < SUB; mi++) {
                                let mm = sh_big[rr * C + mb * SUB + mi];
                                acc += mm * vec2<f32>(b0[mb * SUB + mi], b1[mb * SUB + mi]);
                            }
                        }
                    }
                    w16[((t0 + rr) * hk + h * p.dk + c0) / 2u] = pack_f16x2(acc);
                }
            }
        }
        return;
    }
    for (var col = lid; col < 2u * p.dk; col += WG) {
        var bcol: array<f32, 64>;
        let isk = col < p.dk;
        let cc = select(col - p.dk, col, isk);
        var gl = 0.0;
        if (isk) {
            gl = gam[glast + cc];
        }
        for (var rr = 0u; rr < C; rr++) {
            var x = 0.0;
            if (rr < nv) {
                let at = (t0 + rr) * hk + h * p.dk + cc;
                if (isk) {
                    let gr = gam[at];
                    let kv = k[at];
                    let eg = exp(gr);
                    x = kv * eg;
                    qg[at] = q[at] * eg;
                    kg[at] = kv * exp(gl - gr);
                } else {
                    x = v[at];
                }
            }
            bcol[rr] = sh_beta[rr] * x;
        }
        for (var rr = 0u; rr < nv; rr++) {
            var acc = 0.0;
            for (var mb = 0u; mb < C / SUB; mb++) {
                if (mb * SUB <= rr) {
                    for (var mi = 0u; mi < SUB; mi++) {
                        acc += sh_big[rr * C + mb * SUB + mi] * bcol[mb * SUB + mi];
                    }
                }
            }
            let at = (t0 + rr) * hk + h * p.dk + cc;
            if (isk) {
                w[at] = acc;
            } else {
                u[at] = acc;
            }
        }
    }
}

var<workgroup> sh_s: array<f32, 4096>;   // [K, LANES] state tile, K <= 256
var<workgroup> sh_u: array<f32, 1024>;   // [C, LANES] U of the current chunk

@group(0) @binding(13) var<storage, read_write> hs: array<f32>;  // [N, H, K, V] state before each chunk

// Sequential over chunks, one workgroup per (head, tile of LANES value columns); only the
// state recurrence lives here: S_n is stored for kda_chunk_out, and u is replaced in place
// by U = u - w S_n (each element is read and written by the same thread).
@compute @workgroup_size(256)
fn kda_chunk_state(
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

// Output, parallel over (chunk, head, tile of LANES value columns):
// O = qg S_n + A_qk U with S_n and U staged in shared memory.
@compute @workgroup_size(256)
fn kda_chunk_out(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let tiles = (p.dk + LANES - 1u) / LANES;
    let id = wg.x + wg.y * nwg.x;
    if (id >= p.nchunks * p.heads * tiles) {
        return;
    }
    let tile = id % tiles;
    let nh = id / tiles;
    let n = nh / p.heads;
    let h = nh % p.heads;
    let lane = lid % LANES;
    let grp = lid / LANES;
    let col = tile * LANES + lane;
    let live = col < p.dk;
    let hk = p.heads * p.dk;
    let t0 = n * C;
    let nv = rows_in(n);
    let hb = nh * p.dk * p.dk + col;
    for (var c = grp; c < p.dk; c += GROUPS) {
        sh_s[c * LANES + lane] = select(0.0, hs[hb + c * p.dk], live);
    }
    for (var r = grp; r < C; r += GROUPS) {
        sh_u[r * LANES + lane] = select(0.0, u[(t0 + r) * hk + h * p.dk + col], live && r < nv);
    }
    workgroupBarrier();
    let abase = nh * C * C;
    for (var i = 0u; i < C / GROUPS; i++) {
        let r = grp + i * GROUPS;
        if (r < nv && live) {
            let row = (t0 + r) * hk + h * p.dk;
            var oo = 0.0;
            for (var c = 0u; c < p.dk; c++) {
                oo += qg[row + c] * sh_s[c * LANES + lane];
            }
            for (var j = 0u; j <= r; j++) {
                oo += aqk[abase + r * C + j] * sh_u[j * LANES + lane];
            }
            o[row + col] = oo;
        }
    }
}
