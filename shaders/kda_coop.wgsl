// Chunked KDA prefill (spec 4.4) on cooperative matrices (16x16x16, f16 operands staged
// through workgroup memory, f32 accumulation). The SIMT twin is shaders/kda_chunk.wgsl; this
// file runs only where the adapter lists 16x16x16 f16 -> f32 (`Capabilities::coopmat`).
//
//   kda_coop_scan: per (head, tile of BV value columns), sequential over the chunks, the state
//   recurrence AND the output of each chunk (so the per-chunk states are never stored):
//       U   = u - w S_n                      (U, [CR, BV])
//       O_n = qg S_n + A_qk U                (written to o)
//       S   = diag(e^Gamma_last) S_n + kg^T U
//   S stays f32 in workgroup memory (decay applied in f32 by SIMT code, then the kg^T U
//   product is accumulated onto it); its f16 copy is the B operand of w S_n and qg S_n.
//
// Inputs come from kda_chunk_cumsum / kda_chunk_intra (its HALF_OUT variant): w, qg, kg
// [T, H, K] as f16 (the operand precision anyway: half the bytes every value tile re-reads),
// A_qk [N, H, C, C] f16 (zero above the diagonal and in rows past the end), u [T, H, V] f32,
// Gamma [T, H, K] f32.
// Preconditions (checked on the host): K = V, a multiple of 16, <= KMAX; the workgroup's
// subgroups each run whole 16x16 tiles (any subgroup count works).

enable f16;
enable wgpu_cooperative_matrix;

struct KdaCoopParams {
    t_len: u32,
    heads: u32,
    dk: u32,
    nchunks: u32,
}

@group(0) @binding(0) var<uniform> p: KdaCoopParams;
@group(0) @binding(1) var<storage, read> w4: array<vec4<f16>>;    // [T, H, K/4]
@group(0) @binding(2) var<storage, read> u: array<f32>;           // [T, H, V]
@group(0) @binding(3) var<storage, read> qg4: array<vec4<f16>>;   // [T, H, K/4]
@group(0) @binding(4) var<storage, read> kg4: array<vec4<f16>>;   // [T, H, K/4]
@group(0) @binding(5) var<storage, read> aqk4: array<vec4<f16>>;  // [N, H, C, C/4]
@group(0) @binding(6) var<storage, read> gam: array<f32>;         // [T, H, K] within-chunk cumsum
@group(0) @binding(7) var<storage, read_write> state: array<f32>; // [H, K, V]
@group(0) @binding(8) var<storage, read_write> o: array<f32>;     // [T, H, V]

const WG: u32 = 128u;    // 4 subgroups of 32: each has a tile in every phase; 6 workgroups per SM
const CR: u32 = 64u;      // chunk rows (not `C`: that would shadow the role name)
const BV: u32 = 16u;      // value columns per workgroup (one coop tile wide)
const KMAX: u32 = 128u;   // largest head dim of this path
const LDT: u32 = 136u;    // row stride (f16 elements) of the staged [CR, K] tile (+8: banks)

var<workgroup> s32: array<f32, 2048>;   // [K, BV] state tile, f32 (KMAX * BV)
var<workgroup> s16: array<f16, 2048>;   // [K, BV] its f16 copy (B operand)
var<workgroup> t16: array<f16, 8704>;   // [CR, LDT] staged -w / kg / qg / A_qk (CR * LDT)
var<workgroup> u16: array<f16, 1024>;   // [CR, BV] U (f16, B operand)
var<workgroup> scr: array<f32, 1024>;   // [CR, BV] f32 staging of u, U, O
var<workgroup> sh_gl: array<f32, 128>;  // e^Gamma_last per key channel (KMAX)

fn rows_in(n: u32) -> u32 {
    return min(CR, p.t_len - n * CR);
}

@compute @workgroup_size(128)
fn kda_coop_scan(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
    @builtin(subgroup_id) sg: u32,
    @builtin(num_subgroups) nsg: u32,
) {
    let tiles = p.dk / BV;
    let id = wg.x + wg.y * nwg.x;
    if (id >= p.heads * tiles) {
        return;
    }
    let h = id / tiles;
    let v0 = (id % tiles) * BV;
    let hk = p.heads * p.dk;
    let dk4 = p.dk / 4u;
    let kt = p.dk / 16u;
    let sbase = h * p.dk * p.dk + v0;
    for (var e = lid; e < p.dk * BV; e += WG) {
        let x = state[sbase + (e / BV) * p.dk + e % BV];
        s32[e] = x;
        s16[e] = f16(x);
    }
    workgroupBarrier();
    for (var n = 0u; n < p.nchunks; n++) {
        let t0 = n * CR;
        let nv = rows_in(n);
        // A: stage -w (rows past the end are 0), u, and the chunk's decay.
        for (var e = lid; e < CR * dk4; e += WG) {
            let r = e / dk4;
            let c4 = e % dk4;
            var x = vec4<f16>(0.0);
            if (r < nv) {
                x = w4[((t0 + r) * p.heads + h) * dk4 + c4];
            }
            let at = r * LDT + c4 * 4u;
            t16[at] = -x.x;
            t16[at + 1u] = -x.y;
            t16[at + 2u] = -x.z;
            t16[at + 3u] = -x.w;
        }
        for (var e = lid; e < CR * BV; e += WG) {
            let r = e / BV;
            var x = 0.0;
            if (r < nv) {
                x = u[(t0 + r) * hk + h * p.dk + v0 + e % BV];
            }
            scr[e] = x;
        }
        for (var c = lid; c < p.dk; c += WG) {
            sh_gl[c] = exp(gam[(t0 + nv - 1u) * hk + h * p.dk + c]);
        }
        workgroupBarrier();
        // B: U = u + (-w) S_n, one 16-row tile per subgroup.
        for (var i = sg; i < CR / 16u; i += nsg) {
            var acc = coopLoadT<coop_mat16x16<f32, C>>(&scr[i * 16u * BV], BV);
            for (var kk = 0u; kk < kt; kk++) {
                let a = coopLoadT<coop_mat16x16<f16, A>>(&t16[i * 16u * LDT + kk * 16u], LDT);
                let b = coopLoadT<coop_mat16x16<f16, B>>(&s16[kk * 16u * BV], BV);
                acc = coopMultiplyAdd(a, b, acc);
            }
            coopStoreT(acc, &scr[i * 16u * BV], BV);
        }
        workgroupBarrier();
        // C: U to f16, stage kg, decay S in f32.
        for (var e = lid; e < CR * BV; e += WG) {
            u16[e] = f16(scr[e]);
        }
        for (var e = lid; e < CR * dk4; e += WG) {
            let r = e / dk4;
            let c4 = e % dk4;
            var x = vec4<f16>(0.0);
            if (r < nv) {
                x = kg4[((t0 + r) * p.heads + h) * dk4 + c4];
            }
            let at = r * LDT + c4 * 4u;
            t16[at] = x.x;
            t16[at + 1u] = x.y;
            t16[at + 2u] = x.z;
            t16[at + 3u] = x.w;
        }
        for (var e = lid; e < p.dk * BV; e += WG) {
            s32[e] *= sh_gl[e / BV];
        }
        workgroupBarrier();
        // D: S = D S_n + kg^T U; kg^T is the column-major view of the staged [CR, K] kg.
        for (var ci = sg; ci < kt; ci += nsg) {
            var acc = coopLoadT<coop_mat16x16<f32, C>>(&s32[ci * 16u * BV], BV);
            for (var kk = 0u; kk < CR / 16u; kk++) {
                let a = coopLoad<coop_mat16x16<f16, A>>(&t16[kk * 16u * LDT + ci * 16u], LDT);
                let b = coopLoadT<coop_mat16x16<f16, B>>(&u16[kk * 16u * BV], BV);
                acc = coopMultiplyAdd(a, b, acc);
            }
            coopStoreT(acc, &s32[ci * 16u * BV], BV);
        }
        workgroupBarrier();
        // E: stage qg; O = qg S_n (s16 still holds S_n).
        for (var e = lid; e < CR * dk4; e += WG) {
            let r = e / dk4;
            let c4 = e % dk4;
            var x = vec4<f16>(0.0);
            if (r < nv) {
                x = qg4[((t0 + r) * p.heads + h) * dk4 + c4];
            }
            let at = r * LDT + c4 * 4u;
            t16[at] = x.x;
            t16[at + 1u] = x.y;
            t16[at + 2u] = x.z;
            t16[at + 3u] = x.w;
        }
        workgroupBarrier();
        for (var i = sg; i < CR / 16u; i += nsg) {
            var acc = coop_mat16x16<f32, C>();
            for (var kk = 0u; kk < kt; kk++) {
                let a = coopLoadT<coop_mat16x16<f16, A>>(&t16[i * 16u * LDT + kk * 16u], LDT);
                let b = coopLoadT<coop_mat16x16<f16, B>>(&s16[kk * 16u * BV], BV);
                acc = coopMultiplyAdd(a, b, acc);
            }
            coopStoreT(acc, &scr[i * 16u * BV], BV);
        }
        workgroupBarrier();
        // F: stage A_qk; the f16 copy of the new state; O += A_qk U (lower block triangle).
        let abase = (n * p.heads + h) * CR * CR;
        for (var e = lid; e < CR * CR / 4u; e += WG) {
            let x = aqk4[abase / 4u + e];
            let at = (e * 4u / CR) * LDT + (e * 4u) % CR;
            t16[at] = x.x;
            t16[at + 1u] = x.y;
            t16[at + 2u] = x.z;
            t16[at + 3u] = x.w;
        }
        for (var e = lid; e < p.dk * BV; e += WG) {
            s16[e] = f16(s32[e]);
        }
        workgroupBarrier();
        for (var i = sg; i < CR / 16u; i += nsg) {
            var acc = coopLoadT<coop_mat16x16<f32, C>>(&scr[i * 16u * BV], BV);
            for (var kk = 0u; kk <= i; kk++) {
                let a = coopLoadT<coop_mat16x16<f16, A>>(&t16[i * 16u * LDT + kk * 16u], LDT);
                let b = coopLoadT<coop_mat16x16<f16, B>>(&u16[kk * 16u * BV], BV);
                acc = coopMultiplyAdd(a, b, acc);
            }
            coopStoreT(acc, &scr[i * 16u * BV], BV);
        }
        workgroupBarrier();
        // G: write the valid rows of O.
        for (var e = lid; e < CR * BV; e += WG) {
            let r = e / BV;
            if (r < nv) {
                o[(t0 + r) * hk + h * p.dk + v0 + e % BV] = scr[e];
            }
        }
        workgroupBarrier();
    }
    for (var e = lid; e < p.dk * BV; e += WG) {
        state[sbase + (e / BV) * p.dk + e % BV] = s32[e];
    }
}
