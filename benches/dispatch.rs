//! What a dispatch costs the GPU by itself: N small copies (28 KB, one hidden state) recorded
//! (a) dependent, one compute pass each (how the engine records today), (b) dependent, all in
//! one compute pass, (c) independent (distinct outputs: no barrier between them), one pass
//! each. GPU time between two stamps around the N dispatches, median of 20 submissions.
//!
//! `cargo bench --bench dispatch`

use k31_engine::bench::median_span;
use k31_engine::gpu::Gpu;
use k31_engine::ops::copy::COPY_VEC4;
use k31_engine::wgpu;

const N: usize = 200;
const WORDS4: u32 = 7168 / 4;

fn main() -> anyhow::Result<()> {
    let gpu = Gpu::open(None)?;
    println!("GPU: {}", gpu.describe());
    let pipeline = gpu.pipelines.get(&gpu, &COPY_VEC4)?;
    let uniform = gpu.uniform("copy params", &k31_engine::ops::copy::CopyParams { words4: WORDS4, ..Default::default() });
    let bytes = WORDS4 as u64 * 16;
    let bufs: Vec<wgpu::Buffer> = (0..N + 1).map(|i| gpu.storage(&format!("b{i}"), bytes)).collect();
    let bind = |src: &wgpu::Buffer, dst: &wgpu::Buffer| {
        gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &pipeline.get_bind_group_layout(0),
            entries: &[
                wgpu::BindGroupEntry { binding: 0, resource: uniform.as_entire_binding() },
                wgpu::BindGroupEntry { binding: 1, resource: src.as_entire_binding() },
                wgpu::BindGroupEntry { binding: 2, resource: dst.as_entire_binding() },
            ],
        })
    };
    // Dependent: b0 -> b1 -> b0 ... ; independent: b0 -> b_i for every i.
    let ping = [bind(&bufs[0], &bufs[1]), bind(&bufs[1], &bufs[0])];
    let fan: Vec<wgpu::BindGroup> = (1..=N).map(|i| bind(&bufs[0], &bufs[i])).collect();
    let groups = WORDS4.div_ceil(256);
    for (name, mode) in [("dependent, a pass each", 0), ("dependent, one pass", 1), ("independent, a pass each", 2), ("independent, one pass", 3)] {
        let t = median_span(&gpu, 3, 20, |enc, stamps| {
            if let Some(st) = stamps {
                drop(enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some("start"), timestamp_writes: Some(st.writes(None, Some(0))) }));
            }
            let bg = |i: usize| if mode < 2 { &ping[i % 2] } else { &fan[i] };
            if mode == 1 || mode == 3 {
                let mut pass = enc.begin_compute_pass(&Default::default());
                pass.set_pipeline(&pipeline);
                for i in 0..N {
                    pass.set_bind_group(0, bg(i), &[]);
                    pass.dispatch_workgroups(groups, 1, 1);
                }
            } else {
                for i in 0..N {
                    let mut pass = enc.begin_compute_pass(&Default::default());
                    pass.set_pipeline(&pipeline);
                    pass.set_bind_group(0, bg(i), &[]);
                    pass.dispatch_workgroups(groups, 1, 1);
                }
            }
            if let Some(st) = stamps {
                drop(enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some("end"), timestamp_writes: Some(st.writes(Some(1), None)) }));
            }
            Ok(())
        })?;
        println!("{name:<28} {:>7.2} us per dispatch ({N} dispatches of a {bytes}-byte copy)", t * 1e6 / N as f64);
    }
    Ok(())
}
