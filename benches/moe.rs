//! MoE benchmarks on the benchmark GPU, next to the copy bandwidth measured in the same run:
//! bf16 GEMV at the K3.1 shapes (every fast-path variant), MXFP4 top-16 expert GEMV of the
//! real 3584 x 3072 experts (decode: gate/up + down, routing read from GPU memory), and a
//! 2048-token prefill MoE chunk (grouped by expert on the GPU).
//! Run: `cargo bench --bench moe [-- --quick] [--experts-only] [--json FILE]`.

use k31_engine::bench::{time_back_to_back, breakdown, copy_bandwidth, time_gpu, Row};
use k31_engine::config::{Activation, ExpertFormat};
use k31_engine::experts::{ExpertStore, ExpertWeights, SlotLayout};
use k31_engine::gpu::{Gpu, GpuTensor};
use k31_engine::layout::DType;
use k31_engine::ops::{gemv, moe};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let json_out = args.iter().position(|a| a == "--json").and_then(|i| args.get(i + 1)).cloned();
    let quick = args.iter().any(|a| a == "--quick");
    // --experts-only: just the MXFP4 decode variants (kernel experiments).
    let experts_only = args.iter().any(|a| a == "--experts-only");
    let gpu = Gpu::open(None)?;
    println!("GPU: {}", gpu.describe());
    let copy = copy_bandwidth(&gpu, if quick { 64 << 20 } else { 1 << 30 })? / 1e9;
    println!("copy bandwidth (read+write): {copy:.1} GB/s");
    let mut rows = Vec::new();

    // bf16 GEMV at K3.1 shapes, each fast-path variant.
    let shapes: &[(&str, usize, usize)] = if experts_only {
        &[]
    } else if quick {
        &[("1024x1024", 1024, 1024)]
    } else {
        &[
            ("q/k/v/g 7168->12288", 12288, 7168),
            ("o_proj 12288->7168", 7168, 12288),
            ("shared up 7168->6144", 6144, 7168),
            ("shared down 6144->7168", 7168, 6144),
            ("latent down 7168->3584", 3584, 7168),
            ("latent up 3584->7168", 7168, 3584),
            ("dense up 7168->33792", 33792, 7168),
            ("lm_head 7168->163840", 163840, 7168),
        ]
    };
    let variants: Vec<_> = gemv::FAST_VARIANTS.iter().filter(|k| !k.needs_subgroups || gpu.caps.subgroups).copied().collect();
    for &(name, n, k) in shapes {
        let bytes: Vec<u8> = (0..n * k).flat_map(|i| half::bf16::from_f32(((i % 13) as f32 - 6.0) * 0.01).to_le_bytes()).collect();
        let w = GpuTensor::upload(&gpu, name, DType::BF16, &[n, k], &bytes, None)?;
        let x = gpu.storage_from("x", &vec![0.5f32; k]);
        let y = gpu.storage("y", (n * 4) as u64);
        for &v in &variants {
            let t = time_gpu(&gpu, 5, 30, |enc, prof| gemv::gemv_into(&gpu, enc, &w, &x, &y, Some(v), false, prof))?;
            let row = Row { name: format!("{} {name}", v.name), time_us: t * 1e6, rate: (n * k * 2) as f64 / t / 1e9, ceiling: copy, unit: "GB/s" };
            row.print();
            rows.push(row);
        }
        // Back to back as in a model's command stream (8 per submission, two copies of W in
        // turn so the previous GEMV's weights are not in L2), default kernel.
        if n * k * 2 <= 512 << 20 {
            let w2 = GpuTensor::upload(&gpu, name, DType::BF16, &[n, k], &bytes, None)?;
            let t = time_back_to_back(&gpu, 3, 20, 8, |enc, i| gemv::gemv(&gpu, enc, if i % 2 == 0 { &w } else { &w2 }, &x, &y, None))?;
            let row = Row { name: format!("gemv back to back {name}"), time_us: t * 1e6, rate: (n * k * 2) as f64 / t / 1e9, ceiling: copy, unit: "GB/s" };
            row.print();
            rows.push(row);
        }
    }

    // MXFP4 experts of the real shape: latent 3584, intermediate 3072.
    let (n_in, n_mid, top_k) = if quick { (512, 256, 4) } else { (3584, 3072, 16) };
    let resident = if quick { 8 } else { 64 };
    let layout = SlotLayout::new(ExpertFormat::Mxfp4, n_in, n_mid)?;
    let mut store = ExpertStore::new(&gpu, layout, 1, resident, resident)?;
    let packed: Vec<u8> = (0..n_mid * n_in / 2).map(|i| (i * 37 % 251) as u8).collect();
    let scales: Vec<u8> = (0..n_mid * n_in / 32).map(|i| 120 + (i % 5) as u8).collect();
    for e in 0..resident {
        store.fill(&gpu, 0, e, &ExpertWeights::Mxfp4 { w1: (&packed, &scales), w3: (&packed, &scales), w2: (&packed, &scales) })?;
    }
    let act = Activation::Situ { beta: 4.0, linear_beta: Some(25.0) };
    // Weight bytes one token reads: 3 matrices of packed nibbles + scales per selected expert.
    let expert_bytes = 3 * (n_mid * n_in / 2 + n_mid * n_in / 32);
    {
        let z: Vec<f32> = (0..n_in).map(|i| 0.25 + ((i * 13 % 17) as f32 - 8.0) * 0.01).collect();
        let z = gpu.storage_from("z", &z);
        // Selected experts spread over the pool (every 4th), weights from GPU memory.
        let idx: Vec<u32> = (0..top_k as u32).map(|j| (j * 4) % resident as u32).collect();
        let idx = gpu.storage_from("idx", &idx);
        let wts = gpu.storage_from("wts", &vec![1.0f32 / top_k as f32; top_k]);
        let h = gpu.storage("h", (top_k * n_mid * 4) as u64);
        let y = gpu.storage("y", (n_in * 4) as u64);
        let call = moe::ExpertCall { layer: 0, tokens: 1, top_k, act, accumulate: false };
        // A printed row of the weight bytes the selected experts read, per `t` seconds.
        let expert_row = |what: &str, t: f64| {
            let row = Row {
                name: format!("mxfp4 top-{top_k} experts {n_in}x{n_mid} {what}"),
                time_us: t * 1e6,
                rate: (top_k * expert_bytes) as f64 / t / 1e9,
                ceiling: copy,
                unit: "GB/s",
            };
            row.print();
            row
        };
        // Every variant's output against the first one's (same inputs): a kernel experiment
        // that is fast but wrong shows up here.
        let mut first: Option<(&str, Vec<f32>)> = None;
        for kern in moe::DECODE_VARIANTS.iter().filter(|v| moe::decode_supported(&gpu, &store.layout, v)) {
            let name = kern.name;
            let t = time_gpu(&gpu, 5, 30, |enc, prof| moe::experts_decode(&gpu, enc, &store, &call, Some(*kern), &z, &idx, &wts, &h, &y, prof))?;
            let got: Vec<f32> = gpu.read(&y, n_in)?;
            match &first {
                None => first = Some((name, got)),
                Some((first_name, want)) => {
                    let num: f64 = want.iter().zip(&got).map(|(&a, &b)| (a as f64 - b as f64).powi(2)).sum();
                    let den: f64 = want.iter().map(|&a| (a as f64).powi(2)).sum();
                    println!("    check {name} vs {first_name}: rel L2 {:.2e}", (num / den.max(1e-300)).sqrt());
                }
            }
            rows.push(expert_row(&format!("decode {name}"), t));
            for (label, secs) in breakdown(&gpu, 10, |enc, prof| moe::experts_decode(&gpu, enc, &store, &call, Some(*kern), &z, &idx, &wts, &h, &y, prof))? {
                println!("    {label:<40} {:>9.2} us", secs * 1e6);
            }
        }
        // The default decode back to back (4 tokens' worth per submission, no per-pass timestamps).
        let t = time_back_to_back(&gpu, 3, 20, 4, |enc, _| moe::experts_decode(&gpu, enc, &store, &call, None, &z, &idx, &wts, &h, &y, None))?;
        rows.push(expert_row("decode, default, back to back", t));
    }

    // Prefill chunk: T tokens, top_k of the resident experts each, grouped on the GPU.
    if !experts_only {
        let t = if quick { 64 } else { 2048 };
        let z = gpu.storage_from("z", &vec![0.25f32; t * n_in]);
        let idx: Vec<u32> = (0..t).flat_map(|r| (0..top_k).map(move |j| ((r * 7 + j * 3) % resident) as u32)).collect();
        // Distinct per token: stride 3 over a pool with gcd(3, resident) = 1 stays distinct for top_k <= resident.
        let idx = gpu.storage_from("idx", &idx);
        let wts = gpu.storage_from("wts", &vec![1.0f32 / top_k as f32; t * top_k]);
        let y = gpu.storage("y", (t * n_in * 4) as u64);
        let scratch = moe::GroupedScratch::new(&gpu, &store, t, top_k);
        let call = moe::ExpertCall { layer: 0, tokens: t, top_k, act, accumulate: false };
        let secs = time_gpu(&gpu, 2, 5, |enc, prof| moe::experts_grouped(&gpu, enc, &store, &call, &z, &idx, &wts, &scratch, &y, prof))?;
        let flops = (t * top_k * 3 * n_in * n_mid * 2) as f64;
        let row = Row {
            name: format!("mxfp4 prefill {t} tokens top-{top_k} of {resident} experts"),
            time_us: secs * 1e6,
            rate: flops / secs / 1e12,
            ceiling: 150.0,
            unit: "TFLOP/s",
        };
        row.print();
        rows.push(row);
    }
    if let Some(path) = json_out {
        std::fs::write(&path, serde_json::to_string_pretty(&serde_json::json!({"gpu": gpu.describe(), "copy_gbs": copy, "rows": rows}))?)?;
    }
    Ok(())
}
