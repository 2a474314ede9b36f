//! How many workgroups run at once per SM for a given workgroup size and declared workgroup
//! memory. The H200's Vulkan driver ran 41 KB and 32 KiB kernels one per SM (docs/perf.md, KDA
//! section); this probe measures the rule instead of inferring it from one kernel at a time.
//!
//! The probe kernel is latency-bound by construction (every iteration is a barrier, a
//! workgroup-memory store and a dependent load), so co-resident workgroups overlap almost
//! perfectly: with `sms` x 8 workgroups the time is about ceil(8 / c) times that of `sms`
//! workgroups, c being the workgroups in flight per SM. Printed: both times and 8 x their ratio
//! (an estimate of c, exact when c divides 8).
//!
//! `cargo bench --bench occupancy -- [--sms N (default 132, the H200)] [--json FILE]`

use k31_engine::bench::median_span;
use k31_engine::gpu::Gpu;
use k31_engine::wgpu;

const PROBE: &str = r#"
override WORDS: u32 = 1024u;
override ITERS: u32 = 512u;
override WG: u32 = 256u;
var<workgroup> buf: array<vec4<f32>, WORDS>;
@group(0) @binding(0) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(WG)
fn probe(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    var a = vec4<f32>(f32(lid), 1.0, 2.0, 3.0);
    for (var i = 0u; i < ITERS; i++) {
        // Stores sweep the whole array so that none of it can be dropped.
        buf[(lid + i * WG) % WORDS] = a;
        workgroupBarrier();
        a = a * 0.999 + buf[(lid * 7u + i) % WORDS];
        workgroupBarrier();
    }
    out[wg.x * WG + lid] = a.x + a.y + a.z + a.w;
}
"#;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    let sms: u32 = arg("--sms").map(|s| s.parse()).transpose()?.unwrap_or(132);
    let json_out = arg("--json");
    let gpu = Gpu::open(None)?;
    println!("GPU: {}", gpu.describe());
    let module = gpu.device.create_shader_module(wgpu::ShaderModuleDescriptor { label: Some("occupancy probe"), source: wgpu::ShaderSource::Wgsl(PROBE.into()) });
    let max_bytes = gpu.device.limits().max_compute_workgroup_storage_size;
    let out = gpu.storage("probe out", (sms as u64) * 8 * 256 * 4);
    let mut rows = Vec::new();
    println!("{:>8} {:>10} {:>12} {:>12} {:>10}", "threads", "wg memory", "sms wgs", "8 x sms wgs", "in flight");
    for threads in [128u32, 256] {
        for kib in [1u32, 4, 8, 10, 12, 14, 16, 18, 20, 24, 28, 32, 40, 48] {
            let bytes = kib * 1024;
            if bytes > max_bytes {
                continue;
            }
            let constants = [("WORDS", (bytes / 16) as f64), ("WG", threads as f64)];
            let pipeline = gpu.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some("occupancy probe"),
                layout: None,
                module: &module,
                entry_point: Some("probe"),
                compilation_options: wgpu::PipelineCompilationOptions { constants: &constants, ..Default::default() },
                cache: None,
            });
            let bind = gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: None,
                layout: &pipeline.get_bind_group_layout(0),
                entries: &[wgpu::BindGroupEntry { binding: 0, resource: out.as_entire_binding() }],
            });
            let time = |groups: u32| {
                median_span(&gpu, 2, 7, |enc, stamps| {
                    let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some("probe"), timestamp_writes: stamps.map(|st| st.writes(Some(0), Some(1))) });
                    pass.set_pipeline(&pipeline);
                    pass.set_bind_group(0, &bind, &[]);
                    pass.dispatch_workgroups(groups, 1, 1);
                    Ok(())
                })
            };
            let one = time(sms)?;
            let eight = time(8 * sms)?;
            let in_flight = 8.0 * one / eight;
            println!("{threads:>8} {:>7} KiB {:>9.1} us {:>9.1} us {in_flight:>10.2}", kib, one * 1e6, eight * 1e6);
            rows.push(serde_json::json!({ "threads": threads, "kib": kib, "one_wave_us": one * 1e6, "eight_waves_us": eight * 1e6, "in_flight": in_flight }));
        }
    }
    if let Some(path) = json_out {
        std::fs::write(&path, serde_json::to_string_pretty(&rows)?)?;
    }
    Ok(())
}
