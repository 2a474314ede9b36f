// Subgroup bf16 GEMV: y[row_offset + r] = sum_c W[r, c] x[c] for one row chunk of W, with
// cols % 8 == 0 (host-checked). Each subgroup owns RS rows at a time: lanes stride over
// the rows' 16-byte units (8 bf16), two units per step with all loads issued before the
// arithmetic, each activation pair reused for the RS rows; row totals come from subgroupAdd,
// so no barrier and no workgroup memory (except with column parts, CS > 1). A separate file because a module using subgroup
// operations needs the SUBGROUP feature; adapters without it keep gemv.wgsl.
// Grid: ceil(rows / RPW) workgroups (folded 2-D past 65535).

#include "lib/gemv_out.wgsl"

@group(0) @binding(5) var<storage, read> w4: array<vec4<u32>>;
@group(0) @binding(6) var<storage, read> x4: array<vec4<f32>>;

override RS: u32 = 2u;
override RPW: u32 = 16u;
// Column parts per row: CS subgroups share each row group, each over every CS-th unit pair,
// and their totals meet in workgroup memory. More, shorter workgroups for matrices with few
// rows (a few hundred 16-row workgroups leave the GPU short of loads in flight).
override CS: u32 = 1u;
const MAX_RS: u32 = 4u;

var<workgroup> part_sum: array<f32, 256>; // [part][row of the workgroup], RPW * CS <= 256

#include "lib/bf16_unit.wgsl"

@compute @workgroup_size(256)
fn gemv_bf16_sg(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(subgroup_invocation_id) lane: u32,
    @builtin(subgroup_size) sgs: u32,
    @builtin(subgroup_id) sg: u32,
    @builtin(num_subgroups) nsg: u32,
    @builtin(local_invocation_index) lid: u32,
) {
    let block = wg.x + wg.y * nwg.x;
    let units = p.cols / 8u;
    let parts = min(CS, nsg);
    let part = sg % parts;
    let groups = nsg / parts;
    let stride = parts * sgs;
    for (var r0 = (sg / parts) * RS; r0 < RPW && sg / parts < groups; r0 += groups * RS) {
        let row0 = block * RPW + r0;
        if (row0 >= p.rows) {
            break;
        }
        var acc: array<f32, MAX_RS>;
        var u = part * sgs + lane;
        // Two units per lane per step: 2 * RS weight loads in flight before any arithmetic.
        for (; u + stride < units; u += 2u * stride) {
            let v = u + stride;
            let a0 = x4[2u * u];
            let b0 = x4[2u * u + 1u];
            let a1 = x4[2u * v];
            let b1 = x4[2u * v + 1u];
            var q0: array<vec4<u32>, MAX_RS>;
            var q1: array<vec4<u32>, MAX_RS>;
            for (var i = 0u; i < RS; i++) {
                let rb = min(row0 + i, p.rows - 1u) * units;
                q0[i] = w4[rb + u];
                q1[i] = w4[rb + v];
            }
            for (var i = 0u; i < RS; i++) {
                acc[i] += unit_dot(q0[i], a0, b0) + unit_dot(q1[i], a1, b1);
            }
        }
        if (u < units) {
            let a0 = x4[2u * u];
            let b0 = x4[2u * u + 1u];
            for (var i = 0u; i < RS; i++) {
                acc[i] += unit_dot(w4[min(row0 + i, p.rows - 1u) * units + u], a0, b0);
            }
        }
        for (var i = 0u; i < RS; i++) {
            let total = subgroupAdd(acc[i]);
            if (lane == 0u && row0 + i < p.rows) {
                if (parts == 1u) {
                    store_y(p.row_offset + row0 + i, total);
                } else {
                    part_sum[part * RPW + r0 + i] = total;
                }
            }
        }
    }
    if (CS > 1u) {
        workgroupBarrier();
        let row = block * RPW + lid;
        if (parts > 1u && lid < RPW && row < p.rows) {
            var total = 0.0;
            for (var j = 0u; j < parts; j++) {
                total += part_sum[j * RPW + lid];
            }
            store_y(p.row_offset + row, total);
        }
    }
}
