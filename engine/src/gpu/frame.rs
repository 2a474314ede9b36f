//! Per-forward reuse of what every dispatch used to create: uniform buffers, scratch
//! buffers and bind groups. Decode runs the same graph every token, so the i-th dispatch of
//! a forward gets the i-th uniform slot, the same scratch buffers come back in the same
//! order, and its bind group is found in the cache instead of being rebuilt. Nothing here
//! changes results: a kernel sees the same bytes as with fresh buffers (scratch contents are
//! stale, which is why debug builds poison recycled scratch with NaN).
//! Frames are per thread (see `FRAMES`).

use std::cell::RefCell;
use std::collections::{HashMap, HashSet, VecDeque};

thread_local! {
    /// One frame per (thread, device): a forward runs on one thread, and forwards on other
    /// threads (tests, several sessions) must not recycle each other's buffers.
    static FRAMES: RefCell<HashMap<u64, Frame>> = RefCell::new(HashMap::new());
}

/// Runs `f` on this thread's frame of device `gpu_id`.
pub(crate) fn with<R>(gpu_id: u64, f: impl FnOnce(&mut Frame) -> R) -> R {
    FRAMES.with(|m| f(m.borrow_mut().entry(gpu_id).or_insert_with(Frame::new)))
}

/// Drops this thread's frame of device `gpu_id` (when the device goes).
pub(crate) fn forget(gpu_id: u64) {
    let _ = FRAMES.try_with(|m| m.borrow_mut().remove(&gpu_id));
}

/// Bytes per uniform slot (>= every params struct and the offset alignment).
const SLOT: u64 = 256;
/// Uniform slots per forward; past this, dispatches fall back to fresh uniform buffers.
const SLOTS: usize = 16384;

#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) struct BindKey {
    pub kernel: &'static str,
    pub uniform_slot: usize,
    pub buffers: Vec<(u32, wgpu::Buffer)>,
}

pub(crate) struct Frame {
    arena: Option<wgpu::Buffer>,
    /// What each arena slot holds (or will hold once `dirty` is written): writes are skipped
    /// when a slot's bytes did not change.
    mirror: Vec<Vec<u8>>,
    /// While batching, changed slots are not written one by one but as one range before the
    /// next submission ([`Frame::take_dirty`]): each queue write cost the H200 ~1.5 us of GPU
    /// time at the submission it went with (docs/perf.md). First and last dirty slot.
    dirty: Option<(usize, usize)>,
    next_slot: usize,
    /// Buffers ready to hand out, per size, each with the submission count at which a scope
    /// returned it this frame (None: last frame's, long submitted).
    free: HashMap<u64, VecDeque<(wgpu::Buffer, Option<u64>)>>,
    /// Encoders submitted through [`crate::gpu::Gpu::flush`] so far.
    pub submissions: u64,
    /// Handed out and not yet returned by a scope, in order.
    out: Vec<(u64, wgpu::Buffer)>,
    /// Every buffer handed out this frame, in first-use order (kept for the next frame).
    kept: Vec<(u64, wgpu::Buffer)>,
    kept_set: HashSet<wgpu::Buffer>,
    binds: HashMap<BindKey, (wgpu::BindGroup, u64)>,
    frame: u64,
    /// Open [`crate::gpu::Gpu::batch_passes`] guards on this thread.
    pub batching: usize,
    /// The compute pass dispatches share while batching, and the address of its encoder.
    pub open_pass: Option<(usize, wgpu::ComputePass<'static>)>,
}

impl Frame {
    pub fn new() -> Frame {
        Frame { arena: None, mirror: Vec::new(), next_slot: 0, free: HashMap::new(), out: Vec::new(), kept: Vec::new(), kept_set: HashSet::new(), binds: HashMap::new(), frame: 0, batching: 0, open_pass: None, submissions: 0, dirty: None }
    }

    /// Starts a forward: slots from 0 again, last forward's scratch buffers reusable in the
    /// order they were handed out; scratch and bind groups the last forward did not use go.
    pub fn begin(&mut self) {
        self.next_slot = 0;
        self.free.clear();
        self.out.clear();
        self.kept_set.clear();
        for (size, b) in self.kept.drain(..) {
            self.free.entry(size).or_default().push_back((b, None));
        }
        let keep = self.frame;
        self.binds.retain(|_, (_, last)| *last == keep);
        self.frame += 1;
    }

    /// The arena slot holding `bytes` for this dispatch (written only if it changed: at once,
    /// or while batching before the next submission), or None when the forward has used every
    /// slot.
    pub fn uniform_slot(&mut self, device: &wgpu::Device, queue: &wgpu::Queue, bytes: &[u8]) -> Option<(wgpu::Buffer, u64, usize)> {
        if self.next_slot >= SLOTS || bytes.len() as u64 > SLOT {
            return None;
        }
        let arena = self
            .arena
            .get_or_insert_with(|| {
                device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("uniform arena"),
                    size: SLOT * SLOTS as u64,
                    usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                })
            })
            .clone();
        let slot = self.next_slot;
        self.next_slot += 1;
        if self.mirror.len() <= slot {
            self.mirror.resize(slot + 1, Vec::new());
        }
        if self.mirror[slot] != bytes {
            self.mirror[slot] = bytes.to_vec();
            if self.batching > 0 && defer_uniforms() {
                self.dirty = Some(self.dirty.map_or((slot, slot), |(lo, hi)| (lo.min(slot), hi.max(slot))));
            } else {
                queue.write_buffer(&arena, slot as u64 * SLOT, bytes);
            }
        }
        Some((arena, slot as u64 * SLOT, slot))
    }

    /// The arena, the byte offset and the bytes of the slots changed and not yet written (one
    /// range; the slots between them are rewritten with what they hold), clearing them.
    pub fn take_dirty(&mut self) -> Option<(wgpu::Buffer, u64, Vec<u8>)> {
        let (lo, hi) = self.dirty.take()?;
        let arena = self.arena.clone()?;
        let mut bytes = vec![0u8; (hi + 1 - lo) * SLOT as usize];
        for (i, m) in self.mirror[lo..=hi].iter().enumerate() {
            bytes[i * SLOT as usize..][..m.len()].copy_from_slice(m);
        }
        Some((arena, lo as u64 * SLOT, bytes))
    }

    /// A storage buffer of `bytes` (rounded to words) for this forward: last forward's buffer
    /// of that size at this point of the graph, or a new one, and whether the debug fill may
    /// overwrite it: a recycled buffer whose last user was submitted (a queue write lands
    /// before unsubmitted work).
    pub fn scratch(&mut self, device: &wgpu::Device, label: &str, bytes: u64) -> (wgpu::Buffer, bool) {
        let size = bytes.div_ceil(4).max(1) * 4;
        let submissions = self.submissions;
        let (buf, fill) = match self.free.get_mut(&size).and_then(|q| q.pop_front()) {
            Some((b, returned)) => (b, returned.is_none_or(|at| submissions > at)),
            None => (
                device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some(label),
                    size,
                    usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                }),
                false,
            ),
        };
        if self.kept_set.insert(buf.clone()) {
            self.kept.push((size, buf.clone()));
        }
        self.out.push((size, buf.clone()));
        (buf, fill)
    }

    /// Marks the start of a scope (see [`Frame::end_scope`]).
    pub fn begin_scope(&mut self) -> usize {
        self.out.len()
    }

    /// Returns the buffers handed out since `mark` for reuse later in this frame (a layer's
    /// internal scratch: the next layer takes the same buffers, so prefill chunks do not
    /// hold one set per layer). Safe because all work runs in queue order.
    pub fn end_scope(&mut self, mark: usize) {
        if mark >= self.out.len() {
            return;
        }
        for (size, b) in self.out.drain(mark..).rev() {
            self.free.entry(size).or_default().push_front((b, Some(self.submissions)));
        }
    }

    pub fn bind_group(&mut self, key: &BindKey) -> Option<wgpu::BindGroup> {
        let frame = self.frame;
        self.binds.get_mut(key).map(|(g, last)| {
            *last = frame;
            g.clone()
        })
    }

    pub fn keep_bind_group(&mut self, key: BindKey, group: wgpu::BindGroup) {
        self.binds.insert(key, (group, self.frame));
    }
}

/// Whether batched forwards write their changed uniform slots as one range per submission;
/// `K31_DEFER_UNIFORMS=0` writes each at once (experiments).
fn defer_uniforms() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    crate::ops::switch_on(&ON, "K31_DEFER_UNIFORMS")
}
