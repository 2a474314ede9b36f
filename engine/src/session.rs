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
        let fits = |data: &[u8], width: usize| data.len() == snap.len * width * 2;
        if !fits(&snap.latent, self.latent.width) || self.keys.is_some() != snap.keys.is_some() {
            return Err(GpuError::Shape("global cache restore: the snapshot's rows do not match this layer".into()));
        }
        if let (Some(k), Some(data)) = (&mut self.keys, &snap.keys) {
            if !fits(data, k.width) {
                return Err(GpuError::Shape("global cache restore: the snapshot's index keys do not match this layer".into()));
            }
            k.upload_bf16(gpu, data)?;
        }
        self.latent.upload_bf16(gpu, &snap.latent)?;
        self.len = snap.len;
        Ok(())
    }
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
        let layers = self.layers.len();
        for (l, k) in &snap.kda {
            match self.layers.get_mut(*l) {
                Some(LayerState::Kda(s)) => s.restore(gpu, k)?,
                _ => return Err(GpuError::Shape(format!("snapshot has KDA state for layer {l}, which is not a KDA layer of this {layers}-layer model"))),
            }
        }
        for (l, c) in &snap.global {
            match self.layers.get_mut(*l) {
                Some(LayerState::Global(s)) => s.restore(gpu, c)?,
                _ => return Err(GpuError::Shape(format!("snapshot has a global cache for layer {l}, which is not a global layer of this {layers}-layer model"))),
            }
        }
        self.position = snap.position;
        self.tokens = snap.tokens.clone();
        Ok(())
    }
}

impl Snapshot {
    /// Writes the snapshot as safetensors: one tensor per state buffer, position and
    /// tokens in the metadata (docs/formats.md).
    pub fn save(&self, path: &Path) -> Result<(), SessionError> {
        let file_err = |reason: String| SessionError::File { what: "write", path: path.display().to_string(), reason };
        // Views borrow the snapshot's buffers: no second copy of a long context's caches.
        let mut tensors: Vec<(String, Vec<usize>, safetensors::Dtype, &[u8])> = Vec::new();
        for (l, k) in &self.kda {
            tensors.push((format!("layers.{l}.kda.state"), vec![k.state.len()], safetensors::Dtype::F32, bytemuck::cast_slice(&k.state)));
            tensors.push((format!("layers.{l}.kda.conv"), vec![k.ring.len()], safetensors::Dtype::F32, bytemuck::cast_slice(&k.ring)));
        }
        for (l, c) in &self.global {
            tensors.push((format!("layers.{l}.global.latent"), vec![c.latent.len() / 2], safetensors::Dtype::BF16, &c.latent));
            if let Some(keys) = &c.keys {
                tensors.push((format!("layers.{l}.global.index_keys"), vec![keys.len() / 2], safetensors::Dtype::BF16, keys));
            }
        }
        let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
            .iter()
            .map(|(n, s, d, b)| safetensors::tensor::TensorView::new(*d, s.clone(), b).map(|v| (n.clone(), v)))
            .collect::<Result<_, _>>()
            .map_err(|e| file_err(e.to_string()))?;
        let kda_pos: Vec<String> = self.kda.iter().map(|(l, k)| format!("{l}:{}", k.pos)).collect();
        let global_len: Vec<String> = self.global.iter().map(|(l, c)| format!("{l}:{}", c.len)).collect();
        let meta = std::collections::HashMap::from([
            ("format".to_string(), "k31-session-1".to_string()),
            ("position".to_string(), self.position.to_string()),
            ("tokens".to_string(), serde_json::to_string(&self.tokens).map_err(|e| file_err(e.to_string()))?),
            ("kda_positions".to_string(), kda_pos.join(",")),
            ("global_lengths".to_string(), global_len.join(",")),
        ]);
        safetensors::serialize_to_file(views, Some(meta), path).map_err(|e| file_err(e.to_string()))
    }

    /// Reads a snapshot written by [`Snapshot::save`].
    pub fn load(path: &Path) -> Result<Snapshot, SessionError> {
        let p = path.display().to_string();
        let bad = |reason: String| SessionError::File { what: "read", path: p.clone(), reason };
        // Mapped, not read: the tensors are copied out once, not twice.
        let file = std::fs::File::open(path).map_err(|e| bad(e.to_string()))?;
        // SAFETY: as with the checkpoint's mapping, the file must not be modified while it is
        // loaded; the mapping lives only for this call.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| bad(e.to_string()))?;
        let bytes: &[u8] = &map;
        let (_, meta) = safetensors::SafeTensors::read_metadata(bytes).map_err(|e| bad(e.to_string()))?;
        let st = safetensors::SafeTensors::deserialize(bytes).map_err(|e| bad(e.to_string()))?;
        let info = meta.metadata().clone().unwrap_or_default();
        if info.get("format").map(String::as_str) != Some("k31-session-1") {
            return Err(bad("not a k31 session snapshot (metadata `format` is not k31-session-1)".into()));
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
        let data = |name: String| -> Result<&[u8], SessionError> {
            st.tensor(&name).map(|t| t.data()).map_err(|_| bad(format!("tensor `{name}` is missing")))
        };
        let mut kda = Vec::new();
        for (l, pos) in pairs("kda_positions")? {
            let state = bytemuck::pod_collect_to_vec(data(format!("layers.{l}.kda.state"))?);
            let ring = bytemuck::pod_collect_to_vec(data(format!("layers.{l}.kda.conv"))?);
            kda.push((l, KdaSnapshot { state, ring, pos: pos as u64 }));
        }
        let mut global = Vec::new();
        for (l, len) in pairs("global_lengths")? {
            let latent = data(format!("layers.{l}.global.latent"))?.to_vec();
            let keys = st.tensor(&format!("layers.{l}.global.index_keys")).ok().map(|t| t.data().to_vec());
            global.push((l, GlobalCacheSnapshot { len, latent, keys }));
        }
        if tokens.len() != position {
            return Err(SessionError::Mismatch { path: p, reason: format!("{} tokens for position {position}", tokens.len()) });
        }
        Ok(Snapshot { position, tokens, kda, global })
    }
}
