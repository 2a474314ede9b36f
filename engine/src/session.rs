//! Every piece of per-sequence state in one place: KDA recurrent state and conv window per
//! KDA layer, latent and index-key caches per global layer, the position and the tokens
//! seen. Snapshot and restore at a prefix boundary (in memory or on disk), so a shared
//! prefix is computed once.

use crate::config::{Mixer, ModelConfig};
use crate::gpu::{Gpu, GpuError};
use crate::layers::global_attn::GlobalCache;
use crate::layers::kda::{KdaSnapshot, KdaState};
use crate::ops::kda::KdaGeom;
use std::path::Path;

/// First page of a global cache, in positions (pages double from there).
const CACHE_PAGE0: usize = 1024;

enum LayerState {
    Kda(KdaState),
    Global(GlobalCache),
}

pub struct Session {
    layers: Vec<LayerState>,
    /// Tokens processed so far (the next token's position).
    pub position: usize,
    /// The ids processed so far, in order.
    pub tokens: Vec<u32>,
}

/// Host copy of one global layer's caches (positions `0..len`), as the bf16 bytes the GPU
/// holds (half the memory of f32; a long context's snapshot is large: ~700 B per position
/// per layer at K3.1's widths).
#[derive(Clone, Debug, PartialEq)]
pub struct GlobalCacheSnapshot {
    pub len: usize,
    pub latent: Vec<u8>,
    pub keys: Option<Vec<u8>>,
}

impl GlobalCache {
    pub fn snapshot(&self, gpu: &Gpu) -> Result<GlobalCacheSnapshot, GpuError> {
        let keys = match &self.keys {
            Some(k) => Some(k.download_bf16(gpu, self.len)?),
            None => None,
        };
        Ok(GlobalCacheSnapshot { len: self.len, latent: self.latent.download_bf16(gpu, self.len)?, keys })
    }

    pub fn restore(&mut self, gpu: &Gpu, snap: &GlobalCacheSnapshot) -> Result<(), GpuError> {
        self.restore_parts(gpu, snap.len, &snap.latent, snap.keys.as_deref())
    }

    /// Whether `len` positions with latent and index-key bytes of these sizes fit this layer.
    fn check_parts(&self, len: usize, latent: usize, keys: Option<usize>) -> Result<(), GpuError> {
        if latent != len * self.latent.width * 2 || self.keys.is_some() != keys.is_some() {
            return Err(GpuError::Shape("global cache restore: the snapshot's rows do not match this layer".into()));
        }
        if let (Some(k), Some(bytes)) = (&self.keys, keys) {
            if bytes != len * k.width * 2 {
                return Err(GpuError::Shape("global cache restore: the snapshot's index keys do not match this layer".into()));
            }
        }
        if len > self.latent.max_rows {
            return Err(GpuError::Shape(format!(
                "global cache restore: the snapshot holds {len} positions, this session's context is {}",
                self.latent.max_rows
            )));
        }
        Ok(())
    }

    fn restore_parts(&mut self, gpu: &Gpu, len: usize, latent: &[u8], keys: Option<&[u8]>) -> Result<(), GpuError> {
        self.check_parts(len, latent.len(), keys.map(<[u8]>::len))?;
        if let (Some(k), Some(data)) = (&mut self.keys, keys) {
            k.upload_bf16(gpu, data)?;
        }
        self.latent.upload_bf16(gpu, latent)?;
        self.len = len;
        Ok(())
    }
}

/// One layer's state as bytes, wherever they are (an in-memory snapshot, a mapped file).
enum LayerBytes<'a> {
    Kda { state: &'a [u8], ring: &'a [u8], pos: u64 },
    Global { len: usize, latent: &'a [u8], keys: Option<&'a [u8]> },
}

/// A host copy of a whole session.
#[derive(Clone, Debug, PartialEq)]
pub struct Snapshot {
    pub position: usize,
    pub tokens: Vec<u32>,
    kda: Vec<(usize, KdaSnapshot)>,
    global: Vec<(usize, GlobalCacheSnapshot)>,
}

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error(transparent)]
    Gpu(#[from] GpuError),
    #[error("cannot {what} {path}: {reason}")]
    File { what: &'static str, path: String, reason: String },
    #[error("the snapshot in {path} does not belong to this model: {reason}")]
    Mismatch { path: String, reason: String },
}

impl Session {
    pub fn new(gpu: &Gpu, cfg: &ModelConfig, max_context: usize) -> Result<Session, GpuError> {
        let mut layers = Vec::with_capacity(cfg.num_layers());
        for spec in &cfg.layers {
            layers.push(match spec.mixer {
                Mixer::Kda => {
                    let k = cfg.kda.as_ref().ok_or_else(|| GpuError::Shape("KDA layer without a KDA config".into()))?;
                    let geom = KdaGeom { heads: k.num_heads, head_dim: k.head_dim, taps: k.conv_kernel, gate: k.gate, post_conv: false };
                    LayerState::Kda(KdaState::new(gpu, &geom))
                }
                Mixer::Global => {
                    let mla = cfg.mla.as_ref().ok_or_else(|| GpuError::Shape("global layer without an MLA config".into()))?;
                    let page0 = CACHE_PAGE0.min(max_context.next_power_of_two()).max(1);
                    LayerState::Global(GlobalCache::new(gpu, mla, cfg.indexer.as_ref(), max_context, page0)?)
                }
            });
        }
        Ok(Session { layers, position: 0, tokens: Vec::new() })
    }

    pub(crate) fn kda_state(&mut self, layer: usize) -> Result<&mut KdaState, GpuError> {
        match self.layers.get_mut(layer) {
            Some(LayerState::Kda(s)) => Ok(s),
            _ => Err(GpuError::Shape(format!("layer {layer} has no KDA state in this session"))),
        }
    }

    pub(crate) fn global_cache(&mut self, layer: usize) -> Result<&mut GlobalCache, GpuError> {
        match self.layers.get_mut(layer) {
            Some(LayerState::Global(c)) => Ok(c),
            _ => Err(GpuError::Shape(format!("layer {layer} has no global cache in this session"))),
        }
    }

    pub(crate) fn advance(&mut self, tokens: &[u32]) {
        self.position += tokens.len();
        self.tokens.extend_from_slice(tokens);
    }

    /// Bytes of global cache in use (positions written so far).
    pub fn cache_bytes(&self) -> u64 {
        self.layers.iter().map(|l| if let LayerState::Global(c) = l { c.used_bytes() } else { 0 }).sum()
    }

    /// Bytes of KDA state (constant per sequence).
    pub fn kda_bytes(&self) -> u64 {
        self.layers.iter().map(|l| if let LayerState::Kda(s) = l { s.state.size() + s.ring.size() } else { 0 }).sum()
    }

    /// Copies the whole session to the host.
    pub fn snapshot(&self, gpu: &Gpu) -> Result<Snapshot, GpuError> {
        let mut kda = Vec::new();
        let mut global = Vec::new();
        for (l, s) in self.layers.iter().enumerate() {
            match s {
                LayerState::Kda(k) => kda.push((l, k.snapshot(gpu)?)),
                LayerState::Global(c) => global.push((l, c.snapshot(gpu)?)),
            }
        }
        Ok(Snapshot { position: self.position, tokens: self.tokens.clone(), kda, global })
    }

    /// Puts the session back to `snap` (taken from a session of the same model).
    pub fn restore(&mut self, gpu: &Gpu, snap: &Snapshot) -> Result<(), GpuError> {
        let mut parts = Vec::new();
        for (l, k) in &snap.kda {
            parts.push((*l, LayerBytes::Kda { state: bytemuck::cast_slice(&k.state), ring: bytemuck::cast_slice(&k.ring), pos: k.pos }));
        }
        for (l, c) in &snap.global {
            parts.push((*l, LayerBytes::Global { len: c.len, latent: &c.latent, keys: c.keys.as_deref() }));
        }
        self.restore_layers(gpu, &parts, snap.position, &snap.tokens)
    }

    /// Writes the session to `path` as [`Snapshot::save`] does, one state buffer at a time:
    /// the host never holds more than one layer's cache (a whole long-context snapshot is
    /// gigabytes).
    pub fn save(&self, gpu: &Gpu, path: &Path) -> Result<(), SessionError> {
        let mut parts = Vec::new();
        let mut kda_pos = Vec::new();
        let mut global_len = Vec::new();
        for (l, s) in self.layers.iter().enumerate() {
            match s {
                LayerState::Kda(k) => {
                    kda_pos.push((l, k.pos as usize));
                    let (state, ring) = k.byte_lens();
                    parts.push(Part::gpu(format!("layers.{l}.kda.state"), safetensors::Dtype::F32, state, move || {
                        gpu.read_bytes(&k.state, 0, state as u64)
                    }));
                    parts.push(Part::gpu(format!("layers.{l}.kda.conv"), safetensors::Dtype::F32, ring, move || {
                        gpu.read_bytes(&k.ring, 0, ring as u64)
                    }));
                }
                LayerState::Global(c) => {
                    global_len.push((l, c.len));
                    let len = c.len;
                    parts.push(Part::gpu(format!("layers.{l}.global.latent"), safetensors::Dtype::BF16, len * c.latent.width * 2, move || {
                        c.latent.download_bf16(gpu, len)
                    }));
                    if let Some(keys) = &c.keys {
                        parts.push(Part::gpu(format!("layers.{l}.global.index_keys"), safetensors::Dtype::BF16, len * keys.width * 2, move || {
                            keys.download_bf16(gpu, len)
                        }));
                    }
                }
            }
        }
        write_file(path, self.position, &self.tokens, &kda_pos, &global_len, parts)
    }

    /// Restores a snapshot file written by [`Session::save`] or [`Snapshot::save`] straight
    /// from its mapping, one layer at a time (no host copy of the caches). Every layer is
    /// checked before any is written, so a file that does not fit leaves the session as it
    /// was.
    pub fn restore_file(&mut self, gpu: &Gpu, path: &Path) -> Result<(), SessionError> {
        let file = SnapshotFile::open(path)?;
        let parts = file.layers()?;
        self.restore_layers(gpu, &parts, file.position, &file.tokens)?;
        Ok(())
    }

    /// Checks every part against its layer, then uploads them, handing each layer's bytes to
    /// the GPU before the next (wgpu stages written bytes on the host until a submission).
    fn restore_layers(&mut self, gpu: &Gpu, parts: &[(usize, LayerBytes)], position: usize, tokens: &[u32]) -> Result<(), GpuError> {
        let layers = self.layers.len();
        for (l, part) in parts {
            match (self.layers.get(*l), part) {
                (Some(LayerState::Kda(s)), LayerBytes::Kda { state, ring, .. }) => s.check_bytes(state.len(), ring.len())?,
                (Some(LayerState::Global(c)), LayerBytes::Global { len, latent, keys }) => c.check_parts(*len, latent.len(), keys.map(<[u8]>::len))?,
                (_, LayerBytes::Kda { .. }) => {
                    return Err(GpuError::Shape(format!("snapshot has KDA state for layer {l}, which is not a KDA layer of this {layers}-layer model")))
                }
                (_, LayerBytes::Global { .. }) => {
                    return Err(GpuError::Shape(format!("snapshot has a global cache for layer {l}, which is not a global layer of this {layers}-layer model")))
                }
            }
        }
        for (l, part) in parts {
            match (&mut self.layers[*l], part) {
                (LayerState::Kda(s), LayerBytes::Kda { state, ring, pos }) => s.restore_bytes(gpu, state, ring, *pos)?,
                (LayerState::Global(c), LayerBytes::Global { len, latent, keys }) => c.restore_parts(gpu, *len, latent, *keys)?,
                _ => unreachable!("checked above"),
            }
            gpu.submit([]);
            gpu.wait()?;
        }
        self.position = position;
        self.tokens = tokens.to_vec();
        Ok(())
    }
}

/// The snapshot file format's name, in its metadata.
const FORMAT: &str = "k31-session-1";

/// One tensor of a snapshot being written; its bytes are fetched when the writer reaches it
/// (safetensors writes tensors one after another), so a streaming save holds one at a time.
struct Part<'a> {
    name: String,
    dtype: safetensors::Dtype,
    shape: [usize; 1],
    bytes: usize,
    fetch: Box<dyn Fn() -> Result<std::borrow::Cow<'a, [u8]>, GpuError> + 'a>,
    /// The first fetch error: the writer cannot take one, so the part writes zeros and the
    /// save fails afterwards.
    failed: std::cell::RefCell<Option<GpuError>>,
}

impl<'a> Part<'a> {
    fn new(name: String, dtype: safetensors::Dtype, bytes: usize, fetch: Box<dyn Fn() -> Result<std::borrow::Cow<'a, [u8]>, GpuError> + 'a>) -> Part<'a> {
        Part { name, dtype, shape: [bytes * 8 / dtype.bitsize()], bytes, fetch, failed: Default::default() }
    }

    fn host(name: String, dtype: safetensors::Dtype, data: &'a [u8]) -> Part<'a> {
        Part::new(name, dtype, data.len(), Box::new(move || Ok(std::borrow::Cow::Borrowed(data))))
    }

    fn gpu(name: String, dtype: safetensors::Dtype, bytes: usize, download: impl Fn() -> Result<Vec<u8>, GpuError> + 'a) -> Part<'a> {
        Part::new(name, dtype, bytes, Box::new(move || download().map(std::borrow::Cow::Owned)))
    }
}

impl safetensors::View for &Part<'_> {
    fn dtype(&self) -> safetensors::Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> std::borrow::Cow<'_, [u8]> {
        match (self.fetch)() {
            Ok(b) if b.len() == self.bytes => b,
            Ok(b) => {
                self.failed.borrow_mut().get_or_insert(GpuError::Shape(format!("{}: {} bytes, expected {}", self.name, b.len(), self.bytes)));
                std::borrow::Cow::Owned(vec![0; self.bytes])
            }
            Err(e) => {
                self.failed.borrow_mut().get_or_insert(e);
                std::borrow::Cow::Owned(vec![0; self.bytes])
            }
        }
    }
    fn data_len(&self) -> usize {
        self.bytes
    }
}

/// Writes a snapshot file: to a sibling temporary file, renamed over `path` only once it is
/// complete, so a failed save never damages an existing snapshot.
fn write_file(path: &Path, position: usize, tokens: &[u32], kda_pos: &[(usize, usize)], global_len: &[(usize, usize)], parts: Vec<Part>) -> Result<(), SessionError> {
    let file_err = |reason: String| SessionError::File { what: "write", path: path.display().to_string(), reason };
    let list = |v: &[(usize, usize)]| v.iter().map(|(l, n)| format!("{l}:{n}")).collect::<Vec<_>>().join(",");
    let meta = std::collections::HashMap::from([
        ("format".to_string(), FORMAT.to_string()),
        ("position".to_string(), position.to_string()),
        ("tokens".to_string(), serde_json::to_string(tokens).map_err(|e| file_err(e.to_string()))?),
        ("kda_positions".to_string(), list(kda_pos)),
        ("global_lengths".to_string(), list(global_len)),
    ]);
    let mut partial = path.as_os_str().to_owned();
    partial.push(".partial");
    let partial = std::path::PathBuf::from(partial);
    let written = safetensors::serialize_to_file(parts.iter().map(|p| (p.name.clone(), p)), Some(meta), &partial).map_err(|e| e.to_string());
    let failed = parts.iter().find_map(|p| p.failed.borrow_mut().take());
    let result = match (written, failed) {
        (Err(e), _) => Err(file_err(e)),
        (Ok(()), Some(e)) => Err(SessionError::Gpu(e)),
        (Ok(()), None) => std::fs::rename(&partial, path).map_err(|e| file_err(e.to_string())),
    };
    if result.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    result
}

/// A mapped snapshot file with its metadata read and its tensor table checked.
struct SnapshotFile {
    path: String,
    map: memmap2::Mmap,
    position: usize,
    tokens: Vec<u32>,
    kda: Vec<(usize, usize)>,
    global: Vec<(usize, usize)>,
}

impl SnapshotFile {
    fn open(path: &Path) -> Result<SnapshotFile, SessionError> {
        let p = path.display().to_string();
        let bad = |reason: String| SessionError::File { what: "read", path: p.clone(), reason };
        if path.is_dir() {
            return Err(bad("it is a directory, not a snapshot file".into()));
        }
        let file = std::fs::File::open(path).map_err(|e| bad(e.to_string()))?;
        // SAFETY: as with the checkpoint's mapping, the file must not be modified while it is
        // mapped; the mapping lives as long as this value.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| bad(e.to_string()))?;
        let (_, meta) = safetensors::SafeTensors::read_metadata(&map).map_err(|e| bad(e.to_string()))?;
        // Checks every tensor's offsets against the file (a truncated file fails here).
        safetensors::SafeTensors::deserialize(&map).map_err(|e| bad(e.to_string()))?;
        let info = meta.metadata().clone().unwrap_or_default();
        if info.get("format").map(String::as_str) != Some(FORMAT) {
            return Err(bad(format!("not a k31 session snapshot (metadata `format` is not {FORMAT})")));
        }
        let field = |k: &str| info.get(k).cloned().ok_or_else(|| bad(format!("metadata `{k}` is missing")));
        let position: usize = field("position")?.parse().map_err(|_| bad("metadata `position` is not a number".into()))?;
        let tokens: Vec<u32> = serde_json::from_str(&field("tokens")?).map_err(|e| bad(format!("metadata `tokens`: {e}")))?;
        let pairs = |k: &str| -> Result<Vec<(usize, usize)>, SessionError> {
            let v = field(k)?;
            v.split(',')
                .filter(|s| !s.is_empty())
                .map(|s| {
                    let (a, b) = s.split_once(':').ok_or_else(|| bad(format!("metadata `{k}` is malformed")))?;
                    Ok((a.parse().map_err(|_| bad(format!("metadata `{k}`")))?, b.parse().map_err(|_| bad(format!("metadata `{k}`")))?))
                })
                .collect()
        };
        let (kda, global) = (pairs("kda_positions")?, pairs("global_lengths")?);
        if tokens.len() != position {
            return Err(SessionError::Mismatch { path: p, reason: format!("{} tokens for position {position}", tokens.len()) });
        }
        Ok(SnapshotFile { path: p, map, position, tokens, kda, global })
    }

    /// Every layer's bytes, borrowed from the mapping (the header parsed once for all).
    fn layers(&self) -> Result<Vec<(usize, LayerBytes<'_>)>, SessionError> {
        let bad = |reason: String| SessionError::File { what: "read", path: self.path.clone(), reason };
        let st = safetensors::SafeTensors::deserialize(&self.map).map_err(|e| bad(e.to_string()))?;
        let tensor = |name: String| st.tensor(&name).ok().map(|t| t.data());
        let required = |name: String| tensor(name.clone()).ok_or_else(|| bad(format!("tensor `{name}` is missing")));
        let mut parts = Vec::new();
        for &(l, pos) in &self.kda {
            let state = required(format!("layers.{l}.kda.state"))?;
            let ring = required(format!("layers.{l}.kda.conv"))?;
            parts.push((l, LayerBytes::Kda { state, ring, pos: pos as u64 }));
        }
        for &(l, len) in &self.global {
            let latent = required(format!("layers.{l}.global.latent"))?;
            let keys = tensor(format!("layers.{l}.global.index_keys"));
            parts.push((l, LayerBytes::Global { len, latent, keys }));
        }
        Ok(parts)
    }
}

/// The token ids a snapshot file holds (its metadata only; the caches are not read).
pub fn snapshot_tokens(path: &Path) -> Result<Vec<u32>, SessionError> {
    Ok(SnapshotFile::open(path)?.tokens)
}

impl Snapshot {
    /// Writes the snapshot as safetensors: one tensor per state buffer, position and
    /// tokens in the metadata (docs/formats.md).
    pub fn save(&self, path: &Path) -> Result<(), SessionError> {
        let mut parts = Vec::new();
        for (l, k) in &self.kda {
            parts.push(Part::host(format!("layers.{l}.kda.state"), safetensors::Dtype::F32, bytemuck::cast_slice(&k.state)));
            parts.push(Part::host(format!("layers.{l}.kda.conv"), safetensors::Dtype::F32, bytemuck::cast_slice(&k.ring)));
        }
        for (l, c) in &self.global {
            parts.push(Part::host(format!("layers.{l}.global.latent"), safetensors::Dtype::BF16, &c.latent));
            if let Some(keys) = &c.keys {
                parts.push(Part::host(format!("layers.{l}.global.index_keys"), safetensors::Dtype::BF16, keys));
            }
        }
        let kda_pos: Vec<(usize, usize)> = self.kda.iter().map(|(l, k)| (*l, k.pos as usize)).collect();
        let global_len: Vec<(usize, usize)> = self.global.iter().map(|(l, c)| (*l, c.len)).collect();
        write_file(path, self.position, &self.tokens, &kda_pos, &global_len, parts)
    }

    /// Reads a snapshot written by [`Snapshot::save`] or [`Session::save`] into host memory
    /// ([`Session::restore_file`] restores one without this copy).
    pub fn load(path: &Path) -> Result<Snapshot, SessionError> {
        let file = SnapshotFile::open(path)?;
        let mut kda = Vec::new();
        let mut global = Vec::new();
        for (l, part) in file.layers()? {
            match part {
                LayerBytes::Kda { state, ring, pos } => {
                    kda.push((l, KdaSnapshot { state: bytemuck::pod_collect_to_vec(state), ring: bytemuck::pod_collect_to_vec(ring), pos }))
                }
                LayerBytes::Global { len, latent, keys } => {
                    global.push((l, GlobalCacheSnapshot { len, latent: latent.to_vec(), keys: keys.map(<[u8]>::to_vec) }))
                }
            }
        }
        Ok(Snapshot { position: file.position, tokens: file.tokens, kda, global })
    }
}
