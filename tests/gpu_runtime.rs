//! The GPU runtime on whatever adapter the machine has (lavapipe in CI): device, tensors
//! split across bindings (including one larger than lavapipe's 128 MiB binding limit),
//! pipelines, the profiler, and the gemv kernel against its CPU reference.

mod support;

use k31_engine::gpu::{tensor::rows_per_chunk, Gpu, GpuTensor, Profiler};
use k31_engine::layout::DType;
use k31_engine::ops::gemv::gemv;
use k31_engine::reference;
use support::{gpu, nmse, random_vec};

fn to_bf16_bytes(v: &[f32]) -> (Vec<u8>, Vec<f32>) {
    let mut bytes = Vec::with_capacity(v.len() * 2);
    let mut rounded = Vec::with_capacity(v.len());
    for &x in v {
        let b = half::bf16::from_f32(x);
        bytes.extend_from_slice(&b.to_le_bytes());
        rounded.push(b.to_f32());
    }
    (bytes, rounded)
}

fn run_gemv(g: &Gpu, w: &GpuTensor, x: &[f32], profiler: Option<&mut Profiler>) -> Vec<f32> {
    let xb = g.storage_from("x", x);
    let y = g.storage("y", (w.rows() * 4) as u64);
    let mut enc = g.device.create_command_encoder(&Default::default());
    gemv(g, &mut enc, w, &xb, &y, profiler).expect("recording gemv");
    g.queue.submit([enc.finish()]);
    g.read::<f32>(&y, w.rows()).expect("reading y")
}

#[test]
fn gemv_matches_reference_at_awkward_shapes() {
    let Some(g) = gpu() else { return };
    for (i, &(rows, cols)) in [(1, 1), (17, 33), (65, 127), (127, 256), (300, 1000), (5, 4097)].iter().enumerate() {
        for dtype in [DType::BF16, DType::F32] {
            let wv = random_vec(i as u64, rows * cols);
            let x = random_vec(100 + i as u64, cols);
            let (bytes, wq) = match dtype {
                DType::BF16 => to_bf16_bytes(&wv),
                _ => (bytemuck::cast_slice(&wv).to_vec(), wv.clone()),
            };
            let w = GpuTensor::upload(&g, "w", dtype, &[rows, cols], &bytes, None).expect("upload");
            let got = run_gemv(&g, &w, &x, None);
            let want = reference::gemv::gemv(&wq, rows, cols, &x);
            let e = nmse(&got, &want);
            assert!(e <= 1e-7, "gemv {rows}x{cols} {dtype:?}: nmse {e}");
        }
    }
}

#[test]
fn tensors_split_across_chunks_compute_the_same() {
    let Some(g) = gpu() else { return };
    let (rows, cols) = (1001, 96);
    let wv = random_vec(7, rows * cols);
    let (bytes, wq) = to_bf16_bytes(&wv);
    let x = random_vec(8, cols);
    // Force chunks of a few KiB: many dispatches with row offsets, odd chunk tails.
    let w = GpuTensor::upload(&g, "w", DType::BF16, &[rows, cols], &bytes, Some(7 * 1024)).expect("upload");
    assert!(w.chunks.len() > 20, "expected many chunks, got {}", w.chunks.len());
    assert_eq!(w.download(&g).expect("download"), bytes, "split upload must round-trip");
    let got = run_gemv(&g, &w, &x, None);
    let want = reference::gemv::gemv(&wq, rows, cols, &x);
    assert!(nmse(&got, &want) <= 1e-7);
}

#[test]
fn chunk_rows_keep_word_alignment() {
    assert_eq!(rows_per_chunk(6, 100).expect("fits"), 16); // 96 bytes, multiple of 4
    assert_eq!(rows_per_chunk(1, 10).expect("fits"), 8);
    assert!(rows_per_chunk(1 << 20, 1024).is_err(), "a row larger than a binding is an error");
}

/// A tensor of 160 MiB: more than one binding holds on lavapipe (128 MiB).
#[test]
fn tensor_larger_than_one_binding() {
    let Some(g) = gpu() else { return };
    let (rows, cols) = (20480, 4096); // bf16: 160 MiB
    let bytes_needed = (rows * cols * 2) as u64;
    if bytes_needed > g.caps.max_buffer * 8 {
        eprintln!("skipping: adapter buffers too small");
        return;
    }
    // Cheap deterministic weights: w[r, c] = bf16 of small integers, exact in f32 sums.
    let mut bytes = Vec::with_capacity(bytes_needed as usize);
    for r in 0..rows {
        for c in 0..cols {
            let v = (((r * 7 + c * 3) % 5) as f32) - 2.0;
            bytes.extend_from_slice(&half::bf16::from_f32(v).to_le_bytes());
        }
    }
    let w = GpuTensor::upload(&g, "big", DType::BF16, &[rows, cols], &bytes, None).expect("upload");
    if bytes_needed > g.caps.max_binding {
        assert!(w.chunks.len() >= 2, "a {bytes_needed}-byte tensor must be split on this adapter");
    }
    let x: Vec<f32> = (0..cols).map(|c| ((c % 3) as f32) - 1.0).collect();
    let mut profiler = Profiler::new(&g, 16);
    let got = run_gemv(&g, &w, &x, Some(&mut profiler));
    profiler.collect(&g).expect("profiler readback");
    for r in (0..rows).step_by(997).chain([rows - 1]) {
        let want: f32 = (0..cols).map(|c| ((((r * 7 + c * 3) % 5) as f32) - 2.0) * x[c]).sum();
        assert_eq!(got[r], want, "row {r}");
    }
    if profiler.enabled() {
        let report = profiler.report();
        let row = report.iter().find(|t| t.label == "gemv_bf16").expect("gemv_bf16 in the profile");
        assert_eq!(row.count as usize, w.chunks.len(), "one timed pass per chunk");
        assert!(row.total_ns > 0.0);
    }
}

#[test]
fn gemv_rejects_mismatched_shapes() {
    let Some(g) = gpu() else { return };
    let w = GpuTensor::upload(&g, "w", DType::F32, &[4, 8], &[0u8; 128], None).expect("upload");
    let x = g.storage("x", 4 * 4); // too short
    let y = g.storage("y", 4 * 4);
    let mut enc = g.device.create_command_encoder(&Default::default());
    let err = gemv(&g, &mut enc, &w, &x, &y, None).expect_err("x is too short");
    assert!(err.to_string().contains("needs x of 8"), "{err}");
    let e = GpuTensor::upload(&g, "w", DType::F32, &[4, 8], &[0u8; 100], None).expect_err("wrong byte count");
    assert!(e.to_string().contains("do not hold"), "{e}");
}

#[test]
fn adapter_selection_errors_are_clear() {
    let err = Gpu::open(Some("no-such-adapter-xyz")).err().expect("no adapter by that name");
    let msg = err.to_string();
    assert!(msg.contains("no-such-adapter-xyz") || msg.contains("no usable GPU"), "{msg}");
    let none = k31_engine::gpu::GpuError::NoAdapter.to_string();
    assert!(none.contains("mesa-vulkan-drivers") && none.contains("driver"), "{none}");
}

/// A buffer bound past the adapter's binding limit is a clear error from the dispatch, not a
/// wgpu panic inside bind group creation.
#[test]
fn oversized_binding_is_an_error() {
    let Some(g) = gpu() else { return };
    let n = (g.caps.max_binding / 4 + 64) as usize;
    if (n * 4) as u64 > g.caps.max_buffer {
        return;
    }
    let (x, w, out) = (g.storage("x", (n * 4) as u64), g.storage("w", 256), g.storage("out", (n * 4) as u64));
    let mut enc = g.device.create_command_encoder(&Default::default());
    let err = k31_engine::ops::norm::rms_norm(&g, &mut enc, 1, 64, 1e-5, &x, &w, &out, None).expect_err("oversized binding");
    assert!(err.to_string().contains("rms_norm binding"), "{err}");
    // The copy kernel binds only the copied range, so buffers past one binding are fine.
    let head: Vec<f32> = (0..64).map(|i| i as f32).collect();
    g.queue.write_buffer(&x, 0, bytemuck::cast_slice(&head));
    let mut enc = g.device.create_command_encoder(&Default::default());
    k31_engine::ops::copy::copy(&g, &mut enc, &x, &out, 256, None).expect("copy of 256 bytes");
    g.flush(&mut enc);
    assert_eq!(g.read::<f32>(&out, 64).unwrap(), head);
    // The page touch binds its buffer whole: past one binding it is refused, naming both sizes;
    // within one it records (read-only) and leaves the data as it was.
    let mut enc = g.device.create_command_encoder(&Default::default());
    let err = k31_engine::ops::copy::page_touch(&g, &mut enc, &x, None).expect_err("page touch past one binding");
    assert!(err.to_string().contains(&format!("{} bytes exceeds one binding ({})", n * 4, g.caps.max_binding)), "{err}");
    let small = g.storage_from("touched", &head);
    k31_engine::ops::copy::page_touch(&g, &mut enc, &small, None).expect("page touch of 256 bytes");
    // The read ceiling (benches) likewise, and it never writes its sink.
    let err = k31_engine::ops::copy::read_all(&g, &mut enc, &x, &small, None).expect_err("read past one binding");
    assert!(err.to_string().contains("needs one binding"), "{err}");
    let sink = g.storage_from("read sink", &[7u32; 4]);
    k31_engine::ops::copy::read_all(&g, &mut enc, &small, &sink, None).expect("read of 256 bytes");
    g.flush(&mut enc);
    assert_eq!(g.read::<f32>(&small, 64).unwrap(), head);
    assert_eq!(g.read::<u32>(&sink, 4).unwrap(), [7u32; 4]);
}

/// Prewarming builds, on several threads at once, exactly the kernels the adapter runs and
/// caches them: a later `get` returns the same pipeline, and a kernel the adapter cannot run is
/// skipped and still refused by `get` with an error naming it.
#[test]
fn prewarmed_pipelines_are_the_cached_ones() {
    let Some(g) = gpu() else { return };
    use k31_engine::ops::{copy::COPY_VEC4, gemv::GEMV_BF16};
    let mut kernels = vec![COPY_VEC4, GEMV_BF16];
    // A variant needing a feature the adapter lacks (lavapipe: cooperative matrices).
    let unrunnable = k31_engine::ops::all_kernels().into_iter().find(|k| k31_engine::gpu::pipelines::lacks_feature(&g, k));
    kernels.extend(unrunnable);
    assert_eq!(g.pipelines.prewarm(&g, &kernels, 3), 2, "the two runnable kernels, nothing else");
    let first = g.pipelines.get(&g, &COPY_VEC4).expect("copy");
    assert_eq!(g.pipelines.prewarm(&g, &kernels, 3), 2, "cached kernels count as built");
    assert!(std::sync::Arc::ptr_eq(&first, &g.pipelines.get(&g, &COPY_VEC4).expect("copy")), "not rebuilt");
    if let Some(k) = unrunnable {
        assert!(!g.pipelines.runs_here(&g, &k));
        let err = g.pipelines.get(&g, &k).err().unwrap_or_else(|| panic!("{} was built", k.name)).to_string();
        assert!(err.contains(k.name), "{err}");
    }
}
