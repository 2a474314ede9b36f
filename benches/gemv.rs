//! bf16 GEMV at the K3.1 decode shapes, next to the copy bandwidth measured in the same run.
//! Run: `cargo bench --bench gemv` (prints a table; `--json FILE` also writes the rows).

use k31_engine::bench::{copy_bandwidth, time_gpu, Row};
use k31_engine::gpu::{Gpu, GpuTensor};
use k31_engine::layout::DType;
use k31_engine::ops::gemv::gemv;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let json_out = args.iter().position(|a| a == "--json").and_then(|i| args.get(i + 1)).cloned();
    let quick = args.iter().any(|a| a == "--quick");
    let gpu = Gpu::open(None)?;
    println!("GPU: {}", gpu.describe());
    let copy = copy_bandwidth(&gpu, if quick { 64 << 20 } else { 1 << 30 })? / 1e9;
    println!("copy bandwidth (read+write): {copy:.1} GB/s");
    let shapes: &[(&str, usize, usize)] = if quick {
        &[("quick 1024x1024", 1024, 1024)]
    } else {
        &[
            ("q/k/v/g proj 7168 -> 12288", 12288, 7168),
            ("o_proj 12288 -> 7168", 7168, 12288),
            ("shared experts up 7168 -> 6144", 6144, 7168),
            ("shared experts down 6144 -> 7168", 7168, 6144),
            ("dense MLP up 7168 -> 33792", 33792, 7168),
            ("lm_head 7168 -> 163840", 163840, 7168),
        ]
    };
    let mut rows = Vec::new();
    for &(name, n, k) in shapes {
        let bytes: Vec<u8> = (0..n * k).flat_map(|i| half::bf16::from_f32(((i % 13) as f32 - 6.0) * 0.01).to_le_bytes()).collect();
        let w = GpuTensor::upload(&gpu, name, DType::BF16, &[n, k], &bytes, None)?;
        let x = gpu.storage_from("x", &vec![0.5f32; k]);
        let y = gpu.storage("y", (n * 4) as u64);
        let t = time_gpu(&gpu, 5, 30, |enc, prof| gemv(&gpu, enc, &w, &x, &y, prof))?;
        let row = Row { name: format!("gemv bf16 {name}"), time_us: t * 1e6, rate: (n * k * 2) as f64 / t / 1e9, ceiling: copy, unit: "GB/s" };
        row.print();
        rows.push(row);
    }
    if let Some(path) = json_out {
        std::fs::write(&path, serde_json::to_string_pretty(&serde_json::json!({"gpu": gpu.describe(), "copy_gbs": copy, "rows": rows}))?)?;
    }
    Ok(())
}
