// Rows [first, first + RPW) of one gemv_multi entry (weights MW, outputs through STORE from
// row `at`, activations mx4, params mp),
// the subgroup scheme of gemv_sg.wgsl: RS rows per subgroup pass, two 16-byte units per lane
// step with every load issued before the arithmetic, row totals by subgroupAdd. Included
// once per entry with MW, STORE and entry_rows renamed (gemv_norm.wgsl also renames mx4 and
// mp: its activations sit in workgroup memory).
fn entry_rows(first: u32, rows: u32, at: u32, lane: u32, sgs: u32, sg: u32, nsg: u32) {
    let units = mp.cols / 8u;
    for (var r0 = sg * RS; r0 < RPW; r0 += nsg * RS) {
        let row0 = first + r0;
        if (row0 >= rows) {
            break;
        }
        var acc: array<f32, MAX_RS>;
        var u = lane;
        for (; u + sgs < units; u += 2u * sgs) {
            let v = u + sgs;
            let a0 = mx4[2u * u];
            let b0 = mx4[2u * u + 1u];
            let a1 = mx4[2u * v];
            let b1 = mx4[2u * v + 1u];
            var q0: array<vec4<u32>, MAX_RS>;
            var q1: array<vec4<u32>, MAX_RS>;
            for (var i = 0u; i < RS; i++) {
                let rb = min(row0 + i, rows - 1u) * units;
                q0[i] = MW[rb + u];
                q1[i] = MW[rb + v];
            }
            for (var i = 0u; i < RS; i++) {
                acc[i] += unit_dot(q0[i], a0, b0) + unit_dot(q1[i], a1, b1);
            }
        }
        if (u < units) {
            let a0 = mx4[2u * u];
            let b0 = mx4[2u * u + 1u];
            for (var i = 0u; i < RS; i++) {
                acc[i] += unit_dot(MW[min(row0 + i, rows - 1u) * units + u], a0, b0);
            }
        }
        for (var i = 0u; i < RS; i++) {
            let total = subgroupAdd(acc[i]);
            if (lane == 0u && row0 + i < rows) {
                STORE(at + row0 + i, total);
            }
        }
    }
}
