//! The expert store: routed expert weights in fixed-size slots of one GPU pool buffer,
//! addressed through a (layer, expert) -> slot table that also lives on the GPU. Kernels
//! read only the table and the pool, so a pager can evict and refill slots without any
//! kernel change. Here every expert is resident (filled once at load time).

use crate::config::ExpertFormat;
use crate::gpu::{Gpu, GpuError};

/// Where each matrix sits inside one slot (see the header of shaders/moe.wgsl).
#[derive(Clone, Copy, Debug)]
pub struct SlotLayout {
    pub format: ExpertFormat,
    /// Width the experts read and write (latent width for LatentMoE).
    pub n_in: usize,
    /// Expert intermediate width.
    pub n_mid: usize,
    /// Offsets of w1, w3, w2 weights in 16-byte units.
    pub off_w: [u32; 3],
    /// Offsets of the w1, w3, w2 scale planes in bytes (MXFP4 only).
    pub off_s: [u32; 3],
    pub slot_bytes: u64,
}

impl SlotLayout {
    pub fn new(format: ExpertFormat, n_in: usize, n_mid: usize) -> Result<SlotLayout, GpuError> {
        let align = if format == ExpertFormat::Mxfp4 { 32 } else { 8 };
        if n_in == 0 || n_mid == 0 || !n_in.is_multiple_of(align) || !n_mid.is_multiple_of(align) {
            return Err(GpuError::Shape(format!(
                "expert store: widths {n_in} (in) and {n_mid} (intermediate) must be positive multiples of {align} for {format:?} experts"
            )));
        }
        let (w13, w2, s13, s2) = match format {
            ExpertFormat::Mxfp4 => (n_mid * n_in / 2, n_in * n_mid / 2, n_mid * n_in / 32, n_in * n_mid / 32),
            ExpertFormat::Bf16 => (n_mid * n_in * 2, n_in * n_mid * 2, 0, 0),
        };
        let off_w = [0, (w13 / 16) as u32, (2 * w13 / 16) as u32];
        let s0 = 2 * w13 + w2;
        let off_s = [s0 as u32, (s0 + s13) as u32, (s0 + 2 * s13) as u32];
        let slot_bytes = ((s0 + 2 * s13 + s2) as u64).div_ceil(256) * 256;
        Ok(SlotLayout { format, n_in, n_mid, off_w, off_s, slot_bytes })
    }
}

/// One expert's weights as stored in the checkpoint.
pub enum ExpertWeights<'a> {
    /// (weight_packed, weight_scale) of w1 [n_mid, n_in], w3 [n_mid, n_in], w2 [n_in, n_mid].
    Mxfp4 { w1: (&'a [u8], &'a [u8]), w3: (&'a [u8], &'a [u8]), w2: (&'a [u8], &'a [u8]) },
    /// bf16 bytes of w1, w3 [n_mid, n_in] and w2 [n_in, n_mid].
    Bf16 { w1: &'a [u8], w3: &'a [u8], w2: &'a [u8] },
}

pub struct ExpertStore {
    pub layout: SlotLayout,
    pub num_layers: usize,
    pub num_experts: usize,
    pub capacity: usize,
    /// [capacity * slot_bytes] bytes.
    pub pool: wgpu::Buffer,
    /// [num_layers, num_experts] u32 slot ids (0 for an empty entry: the caller must only
    /// route to resident experts).
    pub table: wgpu::Buffer,
    slots: Vec<Option<u32>>,
    owner: Vec<Option<(usize, usize)>>,
}

impl ExpertStore {
    /// A store of `capacity` slots for `num_layers` x `num_experts` table entries.
    pub fn new(gpu: &Gpu, layout: SlotLayout, num_layers: usize, num_experts: usize, capacity: usize) -> Result<ExpertStore, GpuError> {
        let bytes = layout.slot_bytes * capacity.max(1) as u64;
        if bytes > gpu.caps.max_binding {
            return Err(GpuError::TooLarge {
                what: format!("an expert pool of {capacity} slots of {} bytes", layout.slot_bytes),
                needed: bytes,
                limit: gpu.caps.max_binding,
            });
        }
        let entries = (num_layers * num_experts).max(1);
        Ok(ExpertStore {
            layout,
            num_layers,
            num_experts,
            capacity,
            pool: gpu.storage("expert pool", bytes),
            table: gpu.storage_from("expert table", &vec![0u32; entries]),
            slots: vec![None; entries],
            owner: vec![None; capacity],
        })
    }

    /// Slots needed to keep everything resident, or the error the caller should show.
    pub fn slots_that_fit(gpu: &Gpu, layout: &SlotLayout) -> usize {
        (gpu.caps.max_binding / layout.slot_bytes.max(1)) as usize
    }

    pub fn table_base(&self, layer: usize) -> u32 {
        (layer * self.num_experts) as u32
    }

    pub fn slot_of(&self, layer: usize, expert: usize) -> Option<u32> {
        self.slots.get(layer * self.num_experts + expert).copied().flatten()
    }

    /// Uploads one expert into a free slot and points the table at it. Queue writes: they land
    /// before any work not yet submitted, so a forward that pages must submit first (decode
    /// records several layers per submission, `Model::forward`).
    pub fn fill(&mut self, gpu: &Gpu, layer: usize, expert: usize, w: &ExpertWeights) -> Result<u32, GpuError> {
        if layer >= self.num_layers || expert >= self.num_experts {
            return Err(GpuError::Shape(format!("expert store: ({layer}, {expert}) is outside {} layers x {} experts", self.num_layers, self.num_experts)));
        }
        let slot = match self.slot_of(layer, expert) {
            Some(s) => s,
            None => self.owner.iter().position(|o| o.is_none()).ok_or_else(|| {
                GpuError::Shape(format!("expert store: all {} slots are full (evict one first)", self.capacity))
            })? as u32,
        };
        let l = &self.layout;
        let (a, b) = (l.n_mid * l.n_in, l.n_in * l.n_mid);
        let planes: Vec<(&[u8], u64, usize)> = match (w, l.format) {
            (ExpertWeights::Mxfp4 { w1, w3, w2 }, ExpertFormat::Mxfp4) => vec![
                (w1.0, l.off_w[0] as u64 * 16, a / 2),
                (w3.0, l.off_w[1] as u64 * 16, a / 2),
                (w2.0, l.off_w[2] as u64 * 16, b / 2),
                (w1.1, l.off_s[0] as u64, a / 32),
                (w3.1, l.off_s[1] as u64, a / 32),
                (w2.1, l.off_s[2] as u64, b / 32),
            ],
            (ExpertWeights::Bf16 { w1, w3, w2 }, ExpertFormat::Bf16) => vec![
                (w1, l.off_w[0] as u64 * 16, a * 2),
                (w3, l.off_w[1] as u64 * 16, a * 2),
                (w2, l.off_w[2] as u64 * 16, b * 2),
            ],
            _ => return Err(GpuError::Shape(format!("expert ({layer}, {expert}): weights do not match the store's {:?} format", l.format))),
        };
        let base = slot as u64 * l.slot_bytes;
        for (i, (data, off, len)) in planes.iter().enumerate() {
            if data.len() != *len {
                return Err(GpuError::Shape(format!("expert ({layer}, {expert}): plane {i} has {} bytes, expected {len}", data.len())));
            }
            gpu.queue.write_buffer(&self.pool, base + off, data);
        }
        self.owner[slot as usize] = Some((layer, expert));
        let entry = layer * self.num_experts + expert;
        self.slots[entry] = Some(slot);
        gpu.queue.write_buffer(&self.table, entry as u64 * 4, bytemuck::bytes_of(&slot));
        Ok(slot)
    }

    /// Frees the slot of (layer, expert); its table entry falls back to slot 0.
    pub fn evict(&mut self, gpu: &Gpu, layer: usize, expert: usize) {
        let entry = layer * self.num_experts + expert;
        if let Some(Some(slot)) = self.slots.get(entry).copied() {
            self.owner[slot as usize] = None;
            self.slots[entry] = None;
            gpu.queue.write_buffer(&self.table, entry as u64 * 4, bytemuck::bytes_of(&0u32));
        }
    }
}
