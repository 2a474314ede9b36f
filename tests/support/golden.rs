//! Loading the committed golden data under `tests/golden/` (written by
//! `tools/reference/make_goldens.py`; every file and tensor is described in `tests/golden/README.md`).
//!
//! Self-contained: uses only `safetensors`, `serde_json` and `half`. Include it from an integration
//! test with `#[path = "support/golden.rs"] mod golden;` (or a `mod support;` tree).
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use safetensors::{Dtype, SafeTensors};

/// A float tensor: (shape, row-major values).
pub type Tensor = (Vec<usize>, Vec<f32>);
/// An integer tensor (index data): (shape, row-major values).
pub type IntTensor = (Vec<usize>, Vec<i64>);

/// `CARGO_MANIFEST_DIR/tests/golden`.
pub fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join("golden")
}

/// Resolve `file` relative to [`golden_dir`] unless it is absolute.
pub fn golden_path(file: impl AsRef<Path>) -> PathBuf {
    let f = file.as_ref();
    if f.is_absolute() {
        f.to_path_buf()
    } else {
        golden_dir().join(f)
    }
}

fn read(file: impl AsRef<Path>) -> Vec<u8> {
    let p = golden_path(file);
    std::fs::read(&p).unwrap_or_else(|e| panic!("reading golden file {}: {e}", p.display()))
}

/// All floating-point tensors of a safetensors file (F32, BF16, F16, F64), converted to f32.
/// Integer, bool and u8 tensors are skipped: use [`load_int_tensors`] for those.
pub fn load_tensors(file: impl AsRef<Path>) -> HashMap<String, Tensor> {
    let bytes = read(&file);
    let st = SafeTensors::deserialize(&bytes).expect("parsing safetensors");
    let mut out = HashMap::new();
    for (name, view) in st.tensors() {
        let d = view.data();
        let vals: Vec<f32> = match view.dtype() {
            Dtype::F32 => d
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            Dtype::BF16 => d
                .chunks_exact(2)
                .map(|c| half::bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
                .collect(),
            Dtype::F16 => d
                .chunks_exact(2)
                .map(|c| half::f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
                .collect(),
            Dtype::F64 => d
                .chunks_exact(8)
                .map(|c| f64::from_le_bytes(c.try_into().unwrap()) as f32)
                .collect(),
            _ => continue,
        };
        out.insert(name, (view.shape().to_vec(), vals));
    }
    out
}

/// All integer tensors of a safetensors file (I32, I64, U8, BOOL) as i64: selections, router indices,
/// token ids, packed MXFP4 bytes and scales, clarity flags.
pub fn load_int_tensors(file: impl AsRef<Path>) -> HashMap<String, IntTensor> {
    let bytes = read(&file);
    let st = SafeTensors::deserialize(&bytes).expect("parsing safetensors");
    let mut out = HashMap::new();
    for (name, view) in st.tensors() {
        let d = view.data();
        let vals: Vec<i64> = match view.dtype() {
            Dtype::I32 => d
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i64)
                .collect(),
            Dtype::I64 => d
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
                .collect(),
            Dtype::U8 | Dtype::BOOL => d.iter().map(|&b| b as i64).collect(),
            _ => continue,
        };
        out.insert(name, (view.shape().to_vec(), vals));
    }
    out
}

/// Raw bytes of one tensor (e.g. MXFP4 `weight_packed` / `weight_scale` planes), with dtype and shape.
pub fn load_raw(file: impl AsRef<Path>, name: &str) -> (Dtype, Vec<usize>, Vec<u8>) {
    let bytes = read(&file);
    let st = SafeTensors::deserialize(&bytes).expect("parsing safetensors");
    let v = st
        .tensor(name)
        .unwrap_or_else(|e| panic!("tensor {name}: {e}"));
    (v.dtype(), v.shape().to_vec(), v.data().to_vec())
}

/// A JSON metadata file (e.g. `k31_tiny/outputs.json`, `ops/index.json`).
pub fn load_json(file: impl AsRef<Path>) -> serde_json::Value {
    serde_json::from_slice(&read(file)).expect("parsing golden JSON")
}

/// Get a float tensor or panic with the available names.
pub fn get<'a>(t: &'a HashMap<String, Tensor>, name: &str) -> &'a Tensor {
    t.get(name).unwrap_or_else(|| {
        let mut k: Vec<_> = t.keys().collect();
        k.sort();
        panic!("golden tensor {name} not found; have {k:?}")
    })
}

/// max |a - b| / max |b| (b is the golden reference). Non-finite golden entries (masked scores, -inf)
/// must match exactly and are excluded from the ratio.
pub fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    let (mut num, mut den) = (0f64, 0f64);
    for (&x, &y) in a.iter().zip(b) {
        if !y.is_finite() {
            assert!(x == y, "non-finite golden value {y} vs {x}");
            continue;
        }
        num = num.max((x as f64 - y as f64).abs());
        den = den.max((y as f64).abs());
    }
    if den > 0.0 { num / den } else { num }
}
