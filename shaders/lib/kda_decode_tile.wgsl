// The tiled decode of one workgroup's (head, column tile) (kda.wgsl): the state update
// written back, o returned to the column owners. Included once per prologue with
// decode_tile and TILE_PROLOGUE renamed, so a kernel reaches only its own prologue's
// bindings (kda_decode_t never binds kda_decode_tg's f_b inputs).
fn decode_tile(wg: vec3<u32>, nwg: vec3<u32>, lid: u32) -> TileOut {
    let dk4 = p.dk / 4u;
    let tiles = (dk4 + TC4 - 1u) / TC4;
    let id = wg.x + wg.y * nwg.x;
    if (id >= p.heads * tiles) {
        return TileOut(false, false, 0u, 0u, 0u, vec4<f32>(0.0));
    }
    let h = id / tiles;
    let tile = id % tiles;
    let c4 = lid % TC4;
    let rg = lid / TC4;
    let col4 = tile * TC4 + c4;
    let live = col4 < dk4;
    let base = h * p.dk * dk4 + col4;
    var s: array<vec4<f32>, 16>;
    for (var i = 0u; i < DRMAX; i++) {
        let r = rg + i * DRG;
        if (r < p.dk && live) {
            s[i] = state[base + r * dk4];
        }
    }
    TILE_PROLOGUE(h, tile, lid);
    let beta = sigmoid(blog[h]);
    workgroupBarrier();
    var ak = vec4<f32>(0.0);
    var aq = vec4<f32>(0.0);
    var nrm = vec4<f32>(0.0);
    for (var i = 0u; i < DRMAX; i++) {
        let r = rg + i * DRG;
        if (r < p.dk) {
            let kr = sh_k[r];
            let qr = sh_q[r];
            s[i] *= sh_d[r];
            ak += s[i] * kr;
            aq += s[i] * qr;
            nrm += vec4<f32>(kr * kr, qr * qr, qr * kr, 0.0);
        }
    }
    sh_part[lid] = ak;
    sh_part[DWG + lid] = aq;
    sh_part[2u * DWG + lid] = nrm;
    workgroupBarrier();
    // 3 * TC4 threads each sum one (quantity, column) over the row groups.
    if (lid < 3u * TC4) {
        let x = lid / TC4;
        var tot = vec4<f32>(0.0);
        for (var g = 0u; g < DRG; g++) {
            tot += sh_part[x * DWG + g * TC4 + lid % TC4];
        }
        sh_tot[lid] = tot;
    }
    workgroupBarrier();
    let tn = sh_tot[2u * TC4 + c4];
    let rk = inverseSqrt(tn.x + 1e-6);
    let rq = inverseSqrt(tn.y + 1e-6) * p.scale;
    let vv = vec4<f32>(sh_vt[4u * c4], sh_vt[4u * c4 + 1u], sh_vt[4u * c4 + 2u], sh_vt[4u * c4 + 3u]);
    let u = beta * (vv - sh_tot[c4] * rk);
    let o = sh_tot[TC4 + c4] * rq + u * (tn.z * rk * rq);
    if (live) {
        let uk = u * rk;
        for (var i = 0u; i < DRMAX; i++) {
            let r = rg + i * DRG;
            if (r < p.dk) {
                state[base + r * dk4] = s[i] + sh_k[r] * uk;
            }
        }
    }
    return TileOut(true, live && rg == 0u, h, col4, c4, o);
}
