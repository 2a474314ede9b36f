//! Memory-mapped safetensors checkpoints (single file or sharded), validated against the
//! tensor list the config implies before anything reaches the GPU.

use crate::config::{ConfigError, ModelConfig};
use crate::layout::{expected_tensors, DType, TensorSpec};
use memmap2::Mmap;
use safetensors::SafeTensors;
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("cannot read {path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("{path} is not a valid safetensors file ({reason}); it may be truncated or corrupt: download it again")]
    Corrupt { path: String, reason: String },
    #[error("{path} is not a valid shard index: {reason}")]
    BadIndex { path: String, reason: String },
    #[error("no weights in {dir}: expected model.safetensors or model.safetensors.index.json")]
    NoWeights { dir: String },
    #[error("the checkpoint in {dir} does not match its config.json ({count} problems):\n{list}")]
    Invalid { dir: String, count: usize, list: String },
}

/// One tensor as stored: dtype, shape and the bytes inside the mapped file.
#[derive(Clone, Copy, Debug)]
pub struct TensorView<'a> {
    pub dtype: DType,
    pub shape: &'a [usize],
    pub data: &'a [u8],
}

struct Entry {
    shard: usize,
    dtype: DType,
    /// The file's own name for the dtype (shown in errors, also for dtypes k31 never uses).
    dtype_name: String,
    shape: Vec<usize>,
    /// Byte range within the shard's mapping.
    start: usize,
    end: usize,
}

impl TensorView<'_> {
    /// The values as f32, for float tensors (None for other dtypes).
    pub fn floats(&self) -> Option<Vec<f32>> {
        match self.dtype {
            DType::F32 => Some(bytemuck::pod_collect_to_vec(self.data)),
            DType::BF16 => Some(self.data.chunks_exact(2).map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect()),
            DType::F16 => Some(self.data.chunks_exact(2).map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32()).collect()),
            _ => None,
        }
    }
}

/// An opened checkpoint: the config, the mapped shards and a name -> tensor table keyed
/// by the canonical (unprefixed) name.
pub struct Checkpoint {
    pub dir: PathBuf,
    pub config: ModelConfig,
    shards: Vec<(PathBuf, Mmap)>,
    entries: HashMap<String, Entry>,
}

fn convert_dtype(d: safetensors::Dtype) -> DType {
    match d {
        safetensors::Dtype::BF16 => DType::BF16,
        safetensors::Dtype::F16 => DType::F16,
        safetensors::Dtype::F32 => DType::F32,
        safetensors::Dtype::U8 => DType::U8,
        safetensors::Dtype::I32 => DType::I32,
        safetensors::Dtype::I64 => DType::I64,
        _ => DType::Other,
    }
}

/// Maps the spellings of the K3 wrapper onto the canonical name (docs/formats.md).
pub fn canonical_name(name: &str) -> &str {
    name.strip_prefix("language_model.").unwrap_or(name)
}

/// Tensors outside the text model (vision tower, projector) that a VLM file carries.
fn is_outside_text_model(name: &str) -> bool {
    ["vision_tower.", "multi_modal_projector.", "mm_projector.", "vision_model."].iter().any(|p| name.starts_with(p))
}

impl Checkpoint {
    /// Opens and validates the model directory; every problem is listed in one error.
    pub fn open(dir: &Path) -> Result<Checkpoint, CheckpointError> {
        let config = ModelConfig::from_path(dir)?;
        let files = shard_files(dir)?;
        let io = |p: &Path, source| CheckpointError::Io { path: p.display().to_string(), source };
        let mut shards = Vec::new();
        let mut entries = HashMap::new();
        let mut problems = Vec::new();
        for (si, file) in files.iter().enumerate() {
            let f = std::fs::File::open(file).map_err(|e| io(file, e))?;
            // SAFETY: the mapping is read-only; a file changed underneath us by another
            // process is outside what any loader can defend against.
            let map = unsafe { Mmap::map(&f) }.map_err(|e| io(file, e))?;
            let st = SafeTensors::deserialize(&map)
                .map_err(|e| CheckpointError::Corrupt { path: file.display().to_string(), reason: e.to_string() })?;
            for (name, view) in st.tensors() {
                let data = view.data();
                let start = data.as_ptr() as usize - map.as_ptr() as usize;
                let canon = canonical_name(&name);
                let canon = canon.strip_prefix("layers.").map(|r| format!("model.layers.{r}")).unwrap_or(canon.to_string());
                if is_outside_text_model(&canon) {
                    continue;
                }
                let e = Entry {
                    shard: si,
                    dtype: convert_dtype(view.dtype()),
                    dtype_name: format!("{:?}", view.dtype()).to_lowercase(),
                    shape: view.shape().to_vec(),
                    start,
                    end: start + data.len(),
                };
                if entries.insert(canon.clone(), e).is_some() {
                    problems.push(format!("tensor `{name}` appears twice (in {})", file.display()));
                }
            }
            shards.push((file.clone(), map));
        }
        let mut ck = Checkpoint { dir: dir.to_path_buf(), config, shards, entries };
        problems.extend(ck.validate());
        if problems.is_empty() {
            Ok(ck)
        } else {
            let mut list = String::new();
            for p in &problems {
                let _ = writeln!(list, "  - {p}");
            }
            Err(CheckpointError::Invalid { dir: dir.display().to_string(), count: problems.len(), list })
        }
    }

    /// Checks names, shapes and dtypes against the config; resolves aliases to the canonical
    /// name. Returns every problem found.
    fn validate(&mut self) -> Vec<String> {
        let specs = expected_tensors(&self.config);
        let mut problems = Vec::new();
        let mut used: std::collections::HashSet<String> = std::collections::HashSet::new();
        let mut missing_indexer = 0usize;
        for spec in &specs {
            let found = std::iter::once(&spec.name).chain(spec.aliases.iter()).find(|n| self.entries.contains_key(*n));
            let Some(found) = found.cloned() else {
                if spec.optional {
                    continue;
                }
                if spec.name.contains(".indexer.") {
                    missing_indexer += 1;
                }
                problems.push(format!("missing tensor `{}` (expected shape {})", spec.name, spec.shape.describe()));
                continue;
            };
            used.insert(found.clone());
            let e = &self.entries[&found];
            if !spec.dtype.accepts(e.dtype) {
                problems.push(format!(
                    "tensor `{found}` has dtype {} but must be {}",
                    e.dtype_name,
                    spec.dtype.describe()
                ));
            }
            if !spec.shape.accepts(&e.shape) {
                problems.push(format!(
                    "tensor `{found}` has shape {:?} but the config implies {}",
                    e.shape,
                    spec.shape.describe()
                ));
            }
            if found != spec.name {
                if let Some(e) = self.entries.remove(&found) {
                    self.entries.insert(spec.name.clone(), e);
                    used.insert(spec.name.clone());
                }
            }
        }
        if missing_indexer > 0 {
            problems.push(format!(
                "the config enables DeepSeek sparse attention (index_topk) but {missing_indexer} indexer tensors are \
                 missing; k31 will not silently run dense attention: use a checkpoint with indexer weights, or a \
                 config without index_* keys (Kimi K3)"
            ));
        }
        let mut extra: Vec<&String> = self
            .entries
            .iter()
            .filter(|(n, e)| !used.contains(*n) && !is_empty_placeholder(n, e))
            .map(|(n, _)| n)
            .collect();
        extra.sort();
        for n in extra {
            problems.push(format!("unexpected tensor `{n}`: the config does not use it (wrong config.json for these weights?)"));
        }
        problems
    }

    pub fn tensor(&self, name: &str) -> Option<TensorView<'_>> {
        let e = self.entries.get(name)?;
        let map = &self.shards[e.shard].1;
        Some(TensorView { dtype: e.dtype, shape: &e.shape, data: &map[e.start..e.end] })
    }

    pub fn tensor_names(&self) -> impl Iterator<Item = &str> {
        self.entries.keys().map(|s| s.as_str())
    }

    pub fn shard_paths(&self) -> impl Iterator<Item = &Path> {
        self.shards.iter().map(|(p, _)| p.as_path())
    }

    /// Bytes stored per dtype.
    pub fn bytes_by_dtype(&self) -> BTreeMap<DType, usize> {
        let mut m = BTreeMap::new();
        for e in self.entries.values() {
            *m.entry(e.dtype).or_insert(0) += e.end - e.start;
        }
        m
    }

    /// The tensor spec list this checkpoint was validated against.
    pub fn specs(&self) -> Vec<TensorSpec> {
        expected_tensors(&self.config)
    }
}

/// transformers writes zero-sized shared-expert tensors when there are none.
fn is_empty_placeholder(name: &str, e: &Entry) -> bool {
    e.shape.iter().product::<usize>() == 0 && name.contains("shared_experts.")
}

/// The safetensors files of a model directory: the shards named by the index, else
/// `model.safetensors`, else the only `*.safetensors` file present.
fn shard_files(dir: &Path) -> Result<Vec<PathBuf>, CheckpointError> {
    let index = dir.join("model.safetensors.index.json");
    if index.exists() {
        let bad = |reason: String| CheckpointError::BadIndex { path: index.display().to_string(), reason };
        let text = std::fs::read_to_string(&index)
            .map_err(|source| CheckpointError::Io { path: index.display().to_string(), source })?;
        let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
        let map = v.get("weight_map").and_then(|m| m.as_object()).ok_or_else(|| bad("no `weight_map` object".into()))?;
        let mut files: Vec<String> = Vec::new();
        for (name, f) in map {
            let f = f.as_str().ok_or_else(|| bad(format!("the shard of `{name}` is not a file name")))?;
            if f.contains('/') || f.contains("..") {
                return Err(bad(format!("shard name `{f}` must be a plain file name in the model directory")));
            }
            if !files.iter().any(|x| x == f) {
                files.push(f.to_string());
            }
        }
        files.sort();
        let paths: Vec<PathBuf> = files.iter().map(|f| dir.join(f)).collect();
        let missing: Vec<String> = paths.iter().filter(|p| !p.exists()).map(|p| p.display().to_string()).collect();
        if !missing.is_empty() {
            return Err(bad(format!("shard files are missing: {}", missing.join(", "))));
        }
        return Ok(paths);
    }
    let single = dir.join("model.safetensors");
    if single.exists() {
        return Ok(vec![single]);
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|source| CheckpointError::Io { path: dir.display().to_string(), source })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    found.sort();
    if found.is_empty() {
        return Err(CheckpointError::NoWeights { dir: dir.display().to_string() });
    }
    Ok(found)
}
