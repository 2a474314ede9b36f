// Kimi Delta Attention, per-token part (spec 4.2, 4.3, 2.3): causal short conv + SiLU,
// l2 norm of q and k, the forget gate (bounded or softplus), beta, the fused one-token
// recurrence for decode, and the gated RMSNorm of the output.
//
// Preconditions (checked on the host): head_dim K = V is a multiple of 16 and <= 256;
// qkv holds pre-conv inputs [T, 3P] (q | k | v, P = H*K); conv_w [3P, W] f32 (tap W-1 is the
// current token); ring [W, 3P] f32 holds the pre-conv input of absolute position a in
// slot a % W (slots of positions < 0 are never read); state [H, K, V] f32, rows = key.

#include "lib/kda_prep.wgsl"
#include "lib/bf16_unit.wgsl"

@group(0) @binding(8) var<storage, read_write> state: array<vec4<f32>>; // [H, K, V/4]
@group(0) @binding(9) var<storage, read_write> o_out: array<f32>; // [T, H, V]

const WG: u32 = 256u;

var<workgroup> sh_q: array<f32, WG>;
var<workgroup> sh_k: array<f32, WG>;
var<workgroup> sh_d: array<f32, WG>;   // exp(g)
var<workgroup> sh_ra: array<f32, WG>;
var<workgroup> sh_rb: array<f32, WG>;

// Tree sums of sh_ra and sh_rb over the workgroup; the results land in index 0.
fn reduce2(lid: u32) {
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s >> 1u) {
        if (lid < s) {
            sh_ra[lid] += sh_ra[lid + s];
            sh_rb[lid] += sh_rb[lid + s];
        }
        workgroupBarrier();
    }
}

// Prefill preprocessing, one workgroup per (token, head): conv + SiLU, l2 norm, scale,
// gate, beta. The conv window is saved afterwards by kda_conv_save.
@compute @workgroup_size(256)
fn kda_prep(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let row = wg.x + wg.y * nwg.x;
    if (row >= p.t_len * p.heads) {
        return;
    }
    let t = row / p.heads;
    let h = row % p.heads;
    let pd = p.heads * p.dk;
    var q = 0.0;
    var k = 0.0;
    if (lid < p.dk) {
        let c = h * p.dk + lid;
        q = conv_silu(t, c);
        k = conv_silu(t, pd + c);
        v_out[row * p.dk + lid] = conv_silu(t, 2u * pd + c);
        g_out[row * p.dk + lid] = gate(h, lid, fgate[t * pd + c]);
    }
    sh_ra[lid] = q * q;
    sh_rb[lid] = k * k;
    reduce2(lid);
    if (lid < p.dk) {
        q_out[row * p.dk + lid] = q * inverseSqrt(sh_ra[0] + 1e-6) * p.scale;
        k_out[row * p.dk + lid] = k * inverseSqrt(sh_rb[0] + 1e-6);
    }
    if (lid == 0u) {
        beta_out[row] = sigmoid(blog[row]);
    }
}

// Saves the last min(T, W) pre-conv inputs into the ring (after kda_prep has read it).
@compute @workgroup_size(256)
fn kda_conv_save(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * WG;
    let n3 = 3u * p.heads * p.dk;
    let keep = min(p.t_len, p.taps);
    if (i >= keep * n3) {
        return;
    }
    let t = p.t_len - 1u - i / n3;
    let ch = i % n3;
    ring[((p.pos + t) % p.taps) * n3 + ch] = qkv[t * n3 + ch];
}

// One-token decode, one workgroup per (head, tile of 4*C4 value columns), thread
// (grp, c4) owning key rows grp, grp + GROUPS, ... of one vec4 of value columns. The state
// loads are issued first (into registers), then the per-head prologue (conv, gates) runs
// while they are in flight. One reduction over the key rows gives, per value column,
//   a_k = (D S)^T k,  a_q = (D S)^T q  (k, q not yet normalised)  and |k|^2, |q|^2, q.k;
// since S' = D S + khat u^T with u = beta (v - (D S)^T khat),
//   o = S'^T qhat = (D S)^T qhat + u (khat . qhat),
// so the state is read once, written once, and o needs no second reduction.
// Ring slot pos % W is written with this token; slots of pos-1 .. pos-W+1 are only read,
// so the workgroups of one head never race on the window.
// Variant knob (pipeline override): vec4 value columns per workgroup, 4 or 8. 8: 384
// workgroups at 96 x 128, 4 rows per thread; 4: 768 workgroups, 2 rows per thread.
override C4: u32 = 8u;
override DGROUPS: u32 = 256u / C4;  // key-row groups (C4 * DGROUPS = WG)
const DRPT: u32 = 8u;               // register rows per thread: 256 / DGROUPS <= C4 <= 8

var<workgroup> sh_red: array<vec4<f32>, 768>;   // [3, DGROUPS, C4]: a_k | a_q | (|k|^2, |q|^2, q.k)
var<workgroup> sh_v4: array<vec4<f32>, 8>;      // [C4]
var<workgroup> sh_u4: array<vec4<f32>, 8>;      // [C4] u / |k| per vec4 column

@compute @workgroup_size(256)
fn kda_decode(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let tiles = (p.dk + 4u * C4 - 1u) / (4u * C4);
    let id = wg.x + wg.y * nwg.x;
    if (id >= p.heads * tiles) {
        return;
    }
    let h = id / tiles;
    let tile = id % tiles;
    let c4 = lid % C4;
    let grp = lid / C4;
    let dk4 = p.dk / 4u;
    let col4 = tile * C4 + c4;
    let live = col4 < dk4;
    // State loads first: row r of head h is dk4 vec4s at (h * dk + r) * dk4.
    let base = h * p.dk * dk4 + col4;
    var s: array<vec4<f32>, DRPT>;
    for (var i = 0u; i < C4; i++) {
        let r = grp + i * DGROUPS;
        if (r < p.dk && live) {
            s[i] = state[base + r * dk4];
        }
    }
    // Prologue (while the loads fly): q, k, decay per key channel; v of this tile's columns.
    let pd = p.heads * p.dk;
    let n3 = 3u * pd;
    let slot = (p.pos % p.taps) * n3;
    if (lid < p.dk) {
        let c = h * p.dk + lid;
        sh_q[lid] = conv_silu(0u, c);
        sh_k[lid] = conv_silu(0u, pd + c);
        sh_d[lid] = exp(gate(h, lid, fgate[c]));
        if (tile == 0u) {
            ring[slot + c] = qkv[c];
            ring[slot + pd + c] = qkv[pd + c];
        }
    }
    if (lid < C4 && live) {
        var vv: vec4<f32>;
        for (var e = 0u; e < 4u; e++) {
            let c = 2u * pd + h * p.dk + col4 * 4u + e;
            vv[e] = conv_silu(0u, c);
            ring[slot + c] = qkv[c];
        }
        sh_v4[lid] = vv;
    }
    let beta = sigmoid(blog[h]);
    workgroupBarrier();
    var ak = vec4<f32>(0.0);
    var aq = vec4<f32>(0.0);
    var nrm = vec4<f32>(0.0);
    for (var i = 0u; i < C4; i++) {
        let r = grp + i * DGROUPS;
        if (r < p.dk) {
            let kr = sh_k[r];
            let qr = sh_q[r];
            s[i] *= sh_d[r];
            ak += s[i] * kr;
            aq += s[i] * qr;
            nrm += vec4<f32>(kr * kr, qr * qr, qr * kr, 0.0);
        }
    }
    let at = grp * C4 + c4;
    sh_red[at] = ak;
    sh_red[256u + at] = aq;
    sh_red[512u + at] = nrm;
    workgroupBarrier();
    // Fold the row groups to 8 (thread (j, c4) sums groups j, j + 8, j + 16, ...) ...
    if (lid < 8u * C4) {
        for (var x = 0u; x < 3u; x++) {
            let b = x * 256u + lid;
            var tot = sh_red[b];
            for (var g = 8u; g < DGROUPS; g += 8u) {
                tot += sh_red[b + g * C4];
            }
            sh_red[b] = tot;
        }
    }
    workgroupBarrier();
    // ... then to 1, and finish u and o for this vec4 of columns.
    if (lid < C4) {
        var tk = vec4<f32>(0.0);
        var tq = vec4<f32>(0.0);
        var tn = vec4<f32>(0.0);
        for (var j = 0u; j < 8u; j++) {
            tk += sh_red[j * C4 + lid];
            tq += sh_red[256u + j * C4 + lid];
            tn += sh_red[512u + j * C4 + lid];
        }
        let rk = inverseSqrt(tn.x + 1e-6);
        let rq = inverseSqrt(tn.y + 1e-6) * p.scale;
        let u = beta * (sh_v4[lid] - tk * rk);
        sh_u4[lid] = u * rk;
        if (live) {
            let o = tq * rq + u * (tn.z * rk * rq);
            let ob = h * p.dk + col4 * 4u;
            o_out[ob] = o.x;
            o_out[ob + 1u] = o.y;
            o_out[ob + 2u] = o.z;
            o_out[ob + 3u] = o.w;
        }
    }
    workgroupBarrier();
    if (live) {
        let u = sh_u4[c4];
        for (var i = 0u; i < C4; i++) {
            let r = grp + i * DGROUPS;
            if (r < p.dk) {
                state[base + r * dk4] = s[i] + sh_k[r] * u;
            }
        }
    }
}

// Decode, tiled form: one workgroup of DWG threads per (head, tile of 4*TC4 value columns),
// thread (rg, c4) owning key rows rg, rg + DRG, ... of one vec4 of columns. What differs from
// kda_decode: the prologue issues its loads unconditionally (decode_conv: no branch per tap,
// so the compiler can batch them instead of paying one load latency per tap), every thread
// of the tile computes one channel (kda_decode left v to C4 threads doing 4 channels each),
// and the workgroup size and tile are pipeline constants. On the H200, kda_decode's tiling
// (32 columns, 256 threads) with this prologue is 35 % faster than kda_decode; whole-head
// tiles (96 workgroups) and 128-thread workgroups were slower (docs/perf.md, KDA).
// Needs taps <= DTAPS and K <= DRG * DRMAX (host-checked). Same math, reduction and ring
// handling as kda_decode.
override TC4: u32 = 4u;            // vec4 value columns per workgroup
override DWG: u32 = 128u;          // threads per workgroup
override DRG: u32 = DWG / TC4;     // key-row groups
override DRMAX: u32 = 256u / DRG;  // register rows per thread (<= 16)
const DTAPS: u32 = 4u;

var<workgroup> sh_part: array<vec4<f32>, 3u * DWG>;  // [3, DRG, TC4]: a_k | a_q | norms
var<workgroup> sh_tot: array<vec4<f32>, 3u * TC4>;  // [3, TC4]
var<workgroup> sh_vt: array<f32, 4u * TC4>;         // v of the tile's columns

// silu(conv) of channel ch for the one decode token: all DTAPS loads are unconditional
// (out-of-window taps read a valid slot and are zeroed by select).
fn decode_conv(ch: u32) -> f32 {
    if (p.post_conv == 1u) {
        return qkv[ch];
    }
    let n3 = 3u * p.heads * p.dk;
    var z = conv_w[ch * p.taps + p.taps - 1u] * qkv[ch];
    for (var j = 1u; j < DTAPS; j++) {
        // tap taps-1-j multiplies position pos - j
        let ok = j < p.taps && p.pos >= j;
        // A dropped tap reads the slot of pos + 1 (= pos - taps + 1), never the one written now.
        let a = select(p.pos + 1u, p.pos - j, ok);
        let x = ring[(a % p.taps) * n3 + ch];
        let w = conv_w[ch * p.taps + select(0u, p.taps - 1u - j, ok)];
        z += select(0.0, w * x, ok);
    }
    return silu(z);
}

// Prologue of the tiled decode kernels: sh_q, sh_k (unnormalised), sh_vt for this tile's
// columns, and sh_d = exp(g) per key channel from fgate where `gate_from_fgate`; tile 0 writes
// this token into the ring.
fn prologue_conv(h: u32, tile: u32, lid: u32, gate_from_fgate: bool) {
    let pd = p.heads * p.dk;
    let slot = (p.pos % p.taps) * 3u * pd;
    for (var c = lid; c < p.dk; c += DWG) {
        let ch = h * p.dk + c;
        sh_q[c] = decode_conv(ch);
        sh_k[c] = decode_conv(pd + ch);
        if (gate_from_fgate) {
            sh_d[c] = exp(gate(h, c, fgate[ch]));
        }
        if (tile == 0u) {
            ring[slot + ch] = qkv[ch];
            ring[slot + pd + ch] = qkv[pd + ch];
        }
    }
    let col = tile * 4u * TC4 + lid;
    if (lid < 4u * TC4 && col < p.dk) {
        let ch = 2u * pd + h * p.dk + col;
        sh_vt[lid] = decode_conv(ch);
        ring[slot + ch] = qkv[ch];
    }
}

// kda_decode_t's prologue: the gate's f from fgate.
fn prologue_plain(h: u32, tile: u32, lid: u32) {
    prologue_conv(h, tile, lid, true);
}

// kda_decode_tg's prologue: f = W_fb f_a from fb_partials' sums in sh_fp (its loads issued
// before the conv's, the sums after a barrier).
fn prologue_fused(h: u32, tile: u32, lid: u32) {
    let fb = fb_load(h, lid);
    prologue_conv(h, tile, lid, false);
    fb_partials(fb, lid);
    workgroupBarrier();
    for (var c = lid; c < p.dk; c += DWG) {
        var f = 0.0;
        for (var j = 0u; j < FB_PARTS; j++) {
            f += sh_fp[c * FB_PARTS + j];
        }
        sh_d[c] = exp(gate(h, c, f));
    }
}

// The forget gate's low-rank second matrix inside the decode (kda_decode_tg): f = W_fb f_a
// for the head's K channels, W_fb [P, K] bf16 (rows h K .. h K + K - 1), f_a [K]; thread
// (row lid / FB_PARTS, part lid % FB_PARTS) dots every FB_PARTS-th 16-byte unit of its row.
// Needs DWG >= FB_PARTS * K and K <= 128 (host-checked).
const FB_PARTS: u32 = 4u;
@group(0) @binding(18) var<storage, read> fb_w: array<vec4<u32>>; // [P, K / 8] units
@group(0) @binding(19) var<storage, read> fb_a: array<vec4<f32>>; // [K / 4]
var<workgroup> sh_fp: array<f32, DWG>;

// A thread's W_fb units and the matching f_a, loaded before the prologue's conv loads so the
// two load latencies overlap (K <= 128: at most 4 units per thread; absent ones are 0).
struct FbLoads {
    w0: vec4<u32>,
    w1: vec4<u32>,
    w2: vec4<u32>,
    w3: vec4<u32>,
    a0: vec4<f32>,
    b0: vec4<f32>,
    a1: vec4<f32>,
    b1: vec4<f32>,
    a2: vec4<f32>,
    b2: vec4<f32>,
    a3: vec4<f32>,
    b3: vec4<f32>,
}

fn fb_unit(rb: u32, u: u32, units: u32) -> vec4<u32> {
    var w = vec4<u32>(0u);
    if (u < units) {
        w = fb_w[rb + u];
    }
    return w;
}

fn fb_act(u: u32, units: u32, half: u32) -> vec4<f32> {
    var a = vec4<f32>(0.0);
    if (u < units) {
        a = fb_a[2u * u + half];
    }
    return a;
}

fn fb_load(h: u32, lid: u32) -> FbLoads {
    let r = min(lid / FB_PARTS, p.dk - 1u);
    let units = p.dk / 8u;
    let rb = (h * p.dk + r) * units;
    let q = lid % FB_PARTS;
    return FbLoads(fb_unit(rb, q, units), fb_unit(rb, q + 4u, units), fb_unit(rb, q + 8u, units), fb_unit(rb, q + 12u, units),
        fb_act(q, units, 0u), fb_act(q, units, 1u), fb_act(q + 4u, units, 0u), fb_act(q + 4u, units, 1u),
        fb_act(q + 8u, units, 0u), fb_act(q + 8u, units, 1u), fb_act(q + 12u, units, 0u), fb_act(q + 12u, units, 1u));
}

// This thread's partial of its row of f = W_fb f_a into sh_fp.
fn fb_partials(x: FbLoads, lid: u32) {
    let acc = unit_dot(x.w0, x.a0, x.b0) + unit_dot(x.w1, x.a1, x.b1) + unit_dot(x.w2, x.a2, x.b2) + unit_dot(x.w3, x.a3, x.b3);
    sh_fp[lid] = select(0.0, acc, lid / FB_PARTS < p.dk);
}

// What a tile's decode leaves for its epilogue: o of column vec4 col4 of head h, in the
// threads that own it (`owner`: row group 0 of a live column); `valid` is false for the
// grid's spare workgroups (workgroup-uniform).
struct TileOut {
    valid: bool,
    owner: bool,
    h: u32,
    col4: u32,
    c4: u32,
    o: vec4<f32>,
}

#include "lib/kda_decode_tile.wgsl" decode_tile=decode_tile_plain TILE_PROLOGUE=prologue_plain
#include "lib/kda_decode_tile.wgsl" decode_tile=decode_tile_fused TILE_PROLOGUE=prologue_fused

@compute @workgroup_size(DWG)
fn kda_decode_t(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let r = decode_tile_plain(wg, nwg, lid);
    if (r.owner) {
        let ob = r.h * p.dk + r.col4 * 4u;
        o_out[ob] = r.o.x;
        o_out[ob + 1u] = r.o.y;
        o_out[ob + 2u] = r.o.z;
        o_out[ob + 3u] = r.o.w;
    }
}

@group(0) @binding(15) var<storage, read> gate_in: array<f32>;   // [T, P] output-gate logits
@group(0) @binding(16) var<storage, read> norm_w: array<f32>;    // [V] o_norm weight
@group(0) @binding(17) var<storage, read_write> y_out: array<f32>; // [T, P]

// y = RMSNorm(o; norm_w, eps) * sigmoid(gate), one workgroup per (token, head).
@compute @workgroup_size(256)
fn kda_gated_norm(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let row = wg.x + wg.y * nwg.x;
    if (row >= p.t_len * p.heads) {
        return;
    }
    // Gate and weight loaded with o, before the reduction's barriers.
    let c = min(lid, p.dk - 1u);
    let i = row * p.dk + c;
    let x = select(0.0, o_out[i], lid < p.dk);
    let gw = norm_w[c] * sigmoid(gate_in[i]);
    sh_ra[lid] = x * x;
    sh_rb[lid] = 0.0;
    reduce2(lid);
    if (lid < p.dk) {
        let r = inverseSqrt(sh_ra[0] / f32(p.dk) + p.eps);
        y_out[i] = x * r * gw;
    }
}

var<workgroup> sh_sq: array<f32, TC4>; // [column vec4] o . o

// Decode with whole-head tiles (4 * TC4 >= K, host-checked), the gate's f from f_a and W_fb
// (fb_partials) and kda_gated_norm's output, all in one dispatch: y = RMSNorm(o; norm_w, eps) *
// sigmoid(gate) for the one token, so neither f_b's GEMV nor the head's norm needs a dispatch
// of its own (o itself is not written; fgate is bound but not read).
@compute @workgroup_size(DWG)
fn kda_decode_tg(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let r = decode_tile_fused(wg, nwg, lid);
    if (!r.valid) {
        return;
    }
    // Loaded before the reduction's barrier.
    let c = r.col4 * 4u;
    let i = r.h * p.dk + c;
    var gw = vec4<f32>(0.0);
    if (r.owner) {
        gw = vec4<f32>(norm_w[c], norm_w[c + 1u], norm_w[c + 2u], norm_w[c + 3u])
            * vec4<f32>(sigmoid(gate_in[i]), sigmoid(gate_in[i + 1u]), sigmoid(gate_in[i + 2u]), sigmoid(gate_in[i + 3u]));
    }
    // Row group 0 is threads 0..TC4-1, thread c4 owning column vec4 c4 where it is live.
    if (lid < TC4) {
        sh_sq[lid] = select(0.0, dot(r.o, r.o), r.owner);
    }
    workgroupBarrier();
    if (r.owner) {
        var ss = 0.0;
        for (var j = 0u; j < TC4; j++) {
            ss += sh_sq[j];
        }
        let y = r.o * inverseSqrt(ss / f32(p.dk) + p.eps) * gw;
        y_out[i] = y.x;
        y_out[i + 1u] = y.y;
        y_out[i + 2u] = y.z;
        y_out[i + 3u] = y.w;
    }
}
