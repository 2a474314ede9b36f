//! Tensors that may exceed one storage binding: split along dim 0 into chunks of whole
//! rows, each its own buffer, so a kernel dispatches once per chunk with a row offset.

use super::{Gpu, GpuError};
use crate::layout::DType;

/// One buffer holding rows `first_row .. first_row + rows` of a tensor.
#[derive(Debug)]
pub struct TensorChunk {
    pub buffer: wgpu::Buffer,
    pub first_row: usize,
    pub rows: usize,
}

/// A tensor on the GPU in its checkpoint dtype, `[rows, ...]` split into chunks.
#[derive(Debug)]
pub struct GpuTensor {
    pub label: String,
    pub dtype: DType,
    pub shape: Vec<usize>,
    /// Bytes of one dim-0 row.
    pub row_bytes: usize,
    pub chunks: Vec<TensorChunk>,
}

/// Rows per chunk so that a chunk fits `max_bytes` and its size stays a multiple of 4
/// (kernels read packed data as u32 words).
pub fn rows_per_chunk(row_bytes: usize, max_bytes: u64) -> Result<usize, GpuError> {
    let align = 4 / gcd(row_bytes.max(1), 4);
    let fit = (max_bytes / row_bytes.max(1) as u64) as usize;
    let rows = fit / align * align;
    if rows == 0 {
        return Err(GpuError::TooLarge { what: "one tensor row".into(), needed: (row_bytes * align) as u64, limit: max_bytes });
    }
    Ok(rows)
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 { a } else { gcd(b, a % b) }
}

impl GpuTensor {
    /// Uploads `data` (`shape` in `dtype`), splitting at `max_chunk_bytes` or, by default,
    /// the adapter's binding limit.
    pub fn upload(
        gpu: &Gpu,
        label: &str,
        dtype: DType,
        shape: &[usize],
        data: &[u8],
        max_chunk_bytes: Option<u64>,
    ) -> Result<GpuTensor, GpuError> {
        let numel: usize = shape.iter().product();
        if numel * dtype.size() != data.len() {
            return Err(GpuError::Shape(format!(
                "{label}: {} bytes do not hold {shape:?} of {}",
                data.len(),
                dtype.name()
            )));
        }
        let rows = shape.first().copied().unwrap_or(1);
        let row_bytes = data.len().checked_div(rows).unwrap_or(0);
        let limit = max_chunk_bytes.unwrap_or(gpu.caps.max_binding).min(gpu.caps.max_binding);
        let per = if row_bytes == 0 { rows.max(1) } else { rows_per_chunk(row_bytes, limit)? };
        let mut chunks = Vec::new();
        let mut first = 0;
        while first < rows || chunks.is_empty() {
            let n = per.min(rows - first);
            let bytes = &data[first * row_bytes..(first + n) * row_bytes];
            let buffer = gpu.storage_from(&format!("{label}[{first}..{}]", first + n), bytes);
            chunks.push(TensorChunk { buffer, first_row: first, rows: n });
            first += n;
            if n == 0 {
                break;
            }
        }
        Ok(GpuTensor { label: label.into(), dtype, shape: shape.to_vec(), row_bytes, chunks })
    }

    pub fn rows(&self) -> usize {
        self.shape.first().copied().unwrap_or(1)
    }

    /// Elements in one dim-0 row.
    pub fn row_len(&self) -> usize {
        self.shape.iter().skip(1).product()
    }

    pub fn bytes(&self) -> usize {
        self.rows() * self.row_bytes
    }

    /// Reads the whole tensor back (tests and debugging).
    pub fn download(&self, gpu: &Gpu) -> Result<Vec<u8>, GpuError> {
        let mut out = Vec::with_capacity(self.bytes());
        for c in &self.chunks {
            out.extend(gpu.read_bytes(&c.buffer, 0, (c.rows * self.row_bytes) as u64)?);
        }
        Ok(out)
    }
}
