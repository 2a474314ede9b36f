//! The batched linear layer (prefill GEMM) at the K3.1 prefill shapes: the first kernel
//! (naive), the SIMT kernel and the cooperative-matrix kernel, GPU-timed, in TFLOP/s, each
//! output checked against an f64 CPU reference in the same process (a sample of 64 rows x 64
//! tokens of every timed run; whole outputs at awkward shapes, large activations, chunked
//! weights and a weight beyond f16's range). Lavapipe has no cooperative matrices: this is
//! where the coop kernel's accuracy is checked.
//! Run: `cargo bench --bench linear -- [--quick] [--no-naive] [--json FILE]`.

use k31_engine::bench::time_back_to_back;
use k31_engine::gpu::{Gpu, GpuTensor};
use k31_engine::layout::DType;
use k31_engine::ops::linear::{self, LinearVariant};
use k31_engine::wgpu;

/// Deterministic values in [-1, 1) (splitmix64), filled on every core.
fn pool(seed: u64, n: usize) -> Vec<f32> {
    let mut v = vec![0f32; n];
    let threads = std::thread::available_parallelism().map_or(4, |p| p.get());
    let per = n.div_ceil(threads).max(1);
    std::thread::scope(|s| {
        for (c, part) in v.chunks_mut(per).enumerate() {
            s.spawn(move || {
                for (i, x) in part.iter_mut().enumerate() {
                    let mut z = seed.wrapping_add(((c * per + i) as u64).wrapping_mul(0x9e3779b97f4a7c15));
                    z = (z ^ (z >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
                    z = (z ^ (z >> 27)).wrapping_mul(0x94d049bb133111eb);
                    z ^= z >> 31;
                    *x = (z >> 40) as f32 / (1u64 << 23) as f32 - 1.0;
                }
            });
        }
    });
    v
}

fn bf16_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|&x| half::bf16::from_f32(x).to_le_bytes()).collect()
}

/// Error of `got` [T, rows] against y0 + W x in f64 at the sampled (token, row) pairs:
/// (relative L2, max |error| / max |reference|).
#[allow(clippy::too_many_arguments)]
fn check(w: &[f32], x: &[f32], y0: Option<&[f32]>, got: &[f32], rows: usize, cols: usize, toks: &[usize], rws: &[usize]) -> (f64, f64) {
    let pairs: Vec<(usize, usize)> = toks.iter().flat_map(|&t| rws.iter().map(move |&r| (t, r))).collect();
    let threads = std::thread::available_parallelism().map_or(4, |p| p.get());
    let per = pairs.len().div_ceil(threads).max(1);
    let want: Vec<f64> = std::thread::scope(|s| {
        let hs: Vec<_> = pairs
            .chunks(per)
            .map(|part| {
                s.spawn(move || {
                    part.iter()
                        .map(|&(t, r)| {
                            let d: f64 = (0..cols).map(|c| w[r * cols + c] as f64 * x[t * cols + c] as f64).sum();
                            d + y0.map_or(0.0, |y| y[t * rows + r] as f64)
                        })
                        .collect::<Vec<f64>>()
                })
            })
            .collect();
        hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    let (mut num, mut den, mut max_err, mut max_ref) = (0f64, 0f64, 0f64, 0f64);
    for (&(t, r), &want) in pairs.iter().zip(&want) {
        let e = got[t * rows + r] as f64 - want;
        if e.is_nan() {
            return (f64::NAN, f64::NAN);
        }
        num += e * e;
        den += want * want;
        max_err = max_err.max(e.abs());
        max_ref = max_ref.max(want.abs());
    }
    ((num / den.max(1e-300)).sqrt(), max_err / max_ref.max(1e-300))
}

fn spread(n: usize, k: usize) -> Vec<usize> {
    let mut v: Vec<usize> = (0..k.min(n)).map(|i| i * n / k.min(n)).collect();
    v.push(n - 1);
    v.dedup();
    v
}

fn run(gpu: &Gpu, w: &GpuTensor, tokens: usize, x: &wgpu::Buffer, y: &wgpu::Buffer, accumulate: bool, v: LinearVariant) -> anyhow::Result<()> {
    gpu.begin_frame();
    let mut enc = gpu.device.create_command_encoder(&Default::default());
    linear::linear_variant(gpu, &mut enc, w, tokens, x, y, accumulate, v, None)?;
    gpu.queue.submit([enc.finish()]);
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let json_out = args.iter().position(|a| a == "--json").and_then(|i| args.get(i + 1)).cloned();
    let quick = args.iter().any(|a| a == "--quick");
    let no_naive = args.iter().any(|a| a == "--no-naive");
    let gpu = Gpu::open(None)?;
    println!("GPU: {}  (coopmat {}, subgroups {}..{}, max binding {} MiB)", gpu.describe(), gpu.caps.coopmat, gpu.caps.subgroup_min, gpu.caps.subgroup_max, gpu.caps.max_binding >> 20);
    let mut variants = vec![LinearVariant::Simt];
    let probe = GpuTensor::upload(&gpu, "probe", DType::BF16, &[8, 8], &[0u8; 128], None)?;
    if linear::coop_available(&gpu, &probe) {
        variants.push(LinearVariant::Coop);
    }
    let mut checks = Vec::new();

    // Which k positions of a step reach the output: x one-hot in k (a layout or alignment
    // fault in the staged tiles shows up as a set of k that fail).
    {
        let (rows, cols, tokens) = (128, 32, 128);
        let w: Vec<f32> = pool(6, rows * cols).iter().map(|&v| half::bf16::from_f32(v).to_f32()).collect();
        let wt = GpuTensor::upload(&gpu, "w", DType::BF16, &[rows, cols], &bf16_bytes(&w), None)?;
        let yb = gpu.storage("y", (tokens * rows * 4) as u64);
        for &v in &variants {
            let mut bad = Vec::new();
            for kk in 0..cols {
                let x: Vec<f32> = (0..tokens * cols).map(|i| if i % cols == kk { 1.0 + (i / cols % 5) as f32 } else { 0.0 }).collect();
                let xb = gpu.storage_from("x", &x);
                run(&gpu, &wt, tokens, &xb, &yb, false, v)?;
                let got: Vec<f32> = gpu.read(&yb, tokens * rows)?;
                let (l2, _) = check(&w, &x, None, &got, rows, cols, &(0..tokens).collect::<Vec<_>>(), &(0..rows).collect::<Vec<_>>());
                if l2.is_nan() || l2 >= 1e-5 {
                    bad.push(format!("k{kk}:{l2:.1e}"));
                }
            }
            println!("one-hot k check {v:?}: {}", if bad.is_empty() { "every k exact".to_string() } else { bad.join(" ") });
        }
    }

    // Whole outputs at awkward shapes: (rows, cols, tokens, rows per chunk, accumulate, x scale).
    let awkward: &[(usize, usize, usize, usize, bool, f32)] = &[
        (200, 136, 100, 64, true, 1.0),
        (200, 136, 100, 64, false, 1e5),
        (130, 7168, 17, 130, true, 1.0),
        (7168, 3584, 3, 2000, true, 3e4),
        (129, 64, 2, 129, false, 1.0),
    ];
    println!("\naccuracy at awkward shapes (whole output vs f64 CPU): rel L2 / max err over max |ref|");
    for &(rows, cols, tokens, chunk, acc, xs) in awkward {
        let w: Vec<f32> = pool(1, rows * cols).iter().map(|v| v * 0.05).collect();
        let w: Vec<f32> = w.iter().map(|&v| half::bf16::from_f32(v).to_f32()).collect();
        // Per-token magnitudes over six decades on top of xs.
        let x: Vec<f32> = pool(2, tokens * cols).iter().enumerate().map(|(i, v)| v * xs * 10f32.powi((i / cols) as i32 % 7 - 3)).collect();
        let y0 = pool(3, tokens * rows);
        let wt = GpuTensor::upload(&gpu, "w", DType::BF16, &[rows, cols], &bf16_bytes(&w), Some((chunk * cols * 2) as u64))?;
        let xb = gpu.storage_from("x", &x);
        for &v in &variants {
            let yb = gpu.storage_from("y", &y0);
            run(&gpu, &wt, tokens, &xb, &yb, acc, v)?;
            let got: Vec<f32> = gpu.read(&yb, tokens * rows)?;
            let (l2, mx) = check(&w, &x, acc.then_some(&y0[..]), &got, rows, cols, &(0..tokens).collect::<Vec<_>>(), &(0..rows).collect::<Vec<_>>());
            let name = format!("{v:?} {rows}x{cols} T={tokens} chunks={} acc={acc} x*{xs:e}", wt.chunks.len());
            println!("  {name:<58} {l2:.2e} / {mx:.2e}");
            checks.push(serde_json::json!({"case": name, "rel_l2": l2, "max_rel": mx}));
        }
    }
    // A weight beyond f16's range (the coop kernel's exact fallback for its tile) and weights
    // all below f16's normal range (documented: rounded to the f16 subnormal grid).
    for (what, big, wscale) in [("one weight 1e6", true, 0.05f32), ("all |w| < 1e-6", false, 1e-6)] {
        let (rows, cols, tokens) = (260, 64, 20);
        let mut w: Vec<f32> = pool(4, rows * cols).iter().map(|v| v * wscale).collect();
        if big {
            w[5 * cols + 3] = 1e6;
        }
        let w: Vec<f32> = w.iter().map(|&v| half::bf16::from_f32(v).to_f32()).collect();
        let x = pool(5, tokens * cols);
        let wt = GpuTensor::upload(&gpu, "w", DType::BF16, &[rows, cols], &bf16_bytes(&w), None)?;
        let xb = gpu.storage_from("x", &x);
        let yb = gpu.storage("y", (tokens * rows * 4) as u64);
        for &v in &variants {
            run(&gpu, &wt, tokens, &xb, &yb, false, v)?;
            let got: Vec<f32> = gpu.read(&yb, tokens * rows)?;
            let (l2, mx) = check(&w, &x, None, &got, rows, cols, &(0..tokens).collect::<Vec<_>>(), &(0..rows).collect::<Vec<_>>());
            let name = format!("{v:?} {rows}x{cols} T={tokens} {what}");
            println!("  {name:<58} {l2:.2e} / {mx:.2e}");
            checks.push(serde_json::json!({"case": name, "rel_l2": l2, "max_rel": mx}));
        }
    }

    // K3.1 prefill shapes: (name, rows = N out, cols = K in).
    let shapes: &[(&str, usize, usize)] = if quick {
        &[("1024->2048", 2048, 1024)]
    } else {
        &[
            ("7168->12288", 12288, 7168),
            ("12288->7168", 7168, 12288),
            ("7168->33792", 33792, 7168),
            ("33792->7168", 7168, 33792),
            ("7168->3584", 3584, 7168),
            ("3584->7168", 7168, 3584),
        ]
    };
    let token_counts: &[usize] = if quick { &[256] } else { &[256, 2048] };
    let max_w = shapes.iter().map(|s| s.1 * s.2).max().unwrap_or(0);
    let max_x = shapes.iter().map(|s| s.2).max().unwrap_or(0) * token_counts.iter().max().copied().unwrap_or(0);
    let w_pool: Vec<f32> = pool(11, max_w).iter().map(|v| half::bf16::from_f32(v * 0.05).to_f32()).collect();
    let x_pool = pool(12, max_x);
    let mut rows_out = Vec::new();
    println!("\n{:<14} {:>5} {:<6} {:>10} {:>9}   {:>9} {:>9}", "shape", "T", "kernel", "time us", "TFLOP/s", "rel L2", "max rel");
    for &(name, n, k) in shapes {
        let wt = GpuTensor::upload(&gpu, name, DType::BF16, &[n, k], &bf16_bytes(&w_pool[..n * k]), None)?;
        for &t in token_counts {
            if (t * k * 4) as u64 > gpu.caps.max_binding || (t * n * 4) as u64 > gpu.caps.max_binding {
                println!("{name:<14} {t:>5} skipped: x or y exceeds the binding limit");
                continue;
            }
            let x = &x_pool[..t * k];
            let xb = gpu.storage_from("x", x);
            let yb = gpu.storage("y", (t * n * 4) as u64);
            let mut vs = variants.clone();
            if !no_naive && t <= 256 {
                vs.insert(0, LinearVariant::Naive);
            }
            for &v in &vs {
                let (warm, reps) = if v == LinearVariant::Naive { (1, 3) } else { (3, 10) };
                let secs = time_back_to_back(&gpu, warm, reps, 1, |enc, _| {
                    gpu.begin_frame();
                    linear::linear_variant(&gpu, enc, &wt, t, &xb, &yb, false, v, None)
                })?;
                let got: Vec<f32> = gpu.read(&yb, t * n)?;
                let (l2, mx) = check(&w_pool[..n * k], x, None, &got, n, k, &spread(t, 64), &spread(n, 64));
                let tflops = 2.0 * (t * n * k) as f64 / secs / 1e12;
                let kname = format!("{v:?}").to_lowercase();
                println!("{name:<14} {t:>5} {kname:<6} {:>10.1} {tflops:>9.2}   {l2:>9.2e} {mx:>9.2e}", secs * 1e6);
                rows_out.push(serde_json::json!({"shape": name, "tokens": t, "kernel": kname, "time_us": secs * 1e6, "tflops": tflops, "rel_l2": l2, "max_rel": mx}));
            }
        }
    }
    if let Some(path) = json_out {
        std::fs::write(&path, serde_json::to_string_pretty(&serde_json::json!({"gpu": gpu.describe(), "checks": checks, "rows": rows_out}))?)?;
    }
    Ok(())
}
