//! The selection trace file (`--selection-trace FILE`): JSON lines, documented in
//! docs/formats.md. Line 1 is a header; then one object per (token, layer) selection and one
//! per token text, in the order generation produced them.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use k31_engine::trace::{Selection, SelectionSink};
use serde::{Deserialize, Serialize};

use crate::ViewerError;
use crate::frame::{LayerFigures, LayerSelection, TokenFrame};

pub const FORMAT: &str = "k31-selection-trace";
pub const VERSION: u32 = 1;

/// One line of the file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum TraceLine {
    Header { format: String, version: u32 },
    /// Scores are written as null when not finite (JSON has no NaN).
    Selection { layer: usize, position: usize, positions: Vec<i32>, scores: Vec<Option<f32>> },
    Token { position: usize, text: String },
    Figures { figures: Vec<LayerFigures> },
}

/// A whole trace read back.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Trace {
    /// (layer, position, positions, scores) in file order.
    pub selections: Vec<(usize, usize, Vec<i32>, Vec<f32>)>,
    pub texts: BTreeMap<usize, String>,
    pub figures: Vec<LayerFigures>,
}

impl Trace {
    /// One frame per position (ascending), the form the viewer and exporter take.
    pub fn frames(&self) -> Vec<Arc<TokenFrame>> {
        let mut by_pos: BTreeMap<usize, TokenFrame> = BTreeMap::new();
        for (layer, pos, positions, scores) in &self.selections {
            let f = by_pos.entry(*pos).or_insert_with(|| TokenFrame { position: *pos, ..Default::default() });
            f.layers.push(LayerSelection { layer: *layer, positions: positions.clone(), scores: scores.clone() });
        }
        for (pos, f) in by_pos.iter_mut() {
            if let Some(t) = self.texts.get(pos) {
                f.text = t.clone();
            }
        }
        by_pos.into_values().map(Arc::new).collect()
    }
}

/// Writes a trace; also a [`SelectionSink`], so it can be handed to the engine directly.
/// Lines are serialised and written on a thread of their own: the generating thread only
/// copies each selection into a channel (JSON for 2048 positions per layer per token cost
/// it about as much as a decode step of a small model).
pub struct TraceWriter {
    tx: Option<std::sync::mpsc::Sender<TraceLine>>,
    writer: Option<std::thread::JoinHandle<Result<usize, std::io::Error>>>,
    path: PathBuf,
    seen: Vec<usize>,
}

impl TraceWriter {
    pub fn create(path: &Path) -> Result<Self, ViewerError> {
        let file = File::create(path).map_err(|e| ViewerError::Io(path.to_path_buf(), e))?;
        let (tx, rx) = std::sync::mpsc::channel::<TraceLine>();
        let writer = std::thread::spawn(move || -> Result<usize, std::io::Error> {
            let mut out = BufWriter::new(file);
            let mut lines = 0;
            for l in rx {
                serde_json::to_writer(&mut out, &l).map_err(std::io::Error::other)?;
                out.write_all(b"\n")?;
                lines += 1;
            }
            out.flush()?;
            Ok(lines)
        });
        let mut w = TraceWriter { tx: Some(tx), writer: Some(writer), path: path.to_path_buf(), seen: Vec::new() };
        w.line(TraceLine::Header { format: FORMAT.into(), version: VERSION });
        Ok(w)
    }

    fn line(&mut self, l: TraceLine) {
        // A send fails only once the writer stopped on an error, which `finish` reports.
        if let Some(tx) = &self.tx {
            let _ = tx.send(l);
        }
    }

    pub fn write_selection(&mut self, layer: usize, position: usize, positions: &[i32], scores: &[f32]) {
        let scores = scores.iter().map(|s| s.is_finite().then_some(*s)).collect();
        self.line(TraceLine::Selection { layer, position, positions: positions.to_vec(), scores });
        if !self.seen.contains(&position) {
            self.seen.push(position);
        }
    }

    /// Writes the text of every position recorded since the last call.
    pub fn end_step(&mut self, text: &dyn Fn(usize) -> String) {
        for position in std::mem::take(&mut self.seen) {
            self.line(TraceLine::Token { position, text: text(position) });
        }
    }

    pub fn write_figures(&mut self, figures: &[LayerFigures]) {
        self.line(TraceLine::Figures { figures: figures.to_vec() });
    }

    /// Waits for the writer; reports the first write error, if any, and the lines written.
    pub fn finish(mut self) -> Result<usize, ViewerError> {
        drop(self.tx.take());
        let handle = self.writer.take().expect("the writer thread runs until finish");
        match handle.join() {
            Ok(r) => r.map_err(|e| ViewerError::Io(self.path.clone(), e)),
            Err(_) => Err(ViewerError::Io(self.path.clone(), std::io::Error::other("the trace writer thread panicked"))),
        }
    }
}

impl SelectionSink for TraceWriter {
    fn record(&mut self, s: Selection<'_>) {
        self.write_selection(s.layer, s.position, s.positions, s.scores);
    }
}

/// Reads a trace written by [`TraceWriter`].
pub fn read_trace(path: &Path) -> Result<Trace, ViewerError> {
    let file = File::open(path).map_err(|e| ViewerError::Io(path.to_path_buf(), e))?;
    let mut trace = Trace::default();
    let mut header = false;
    for (i, line) in BufReader::new(file).lines().enumerate() {
        let line = line.map_err(|e| ViewerError::Io(path.to_path_buf(), e))?;
        if line.trim().is_empty() {
            continue;
        }
        let bad = |msg: String| ViewerError::Trace(format!("{}:{}: {msg}", path.display(), i + 1));
        let parsed: TraceLine = serde_json::from_str(&line).map_err(|e| bad(e.to_string()))?;
        if !header && !matches!(parsed, TraceLine::Header { .. }) {
            return Err(bad("the first line is not a k31-selection-trace header".into()));
        }
        match parsed {
            TraceLine::Header { format, version } => {
                if format != FORMAT || version != VERSION {
                    return Err(bad(format!("header says {format} v{version}, expected {FORMAT} v{VERSION}")));
                }
                header = true;
            }
            TraceLine::Selection { layer, position, positions, scores } => {
                if positions.len() != scores.len() {
                    return Err(bad(format!("{} positions but {} scores", positions.len(), scores.len())));
                }
                trace.selections.push((layer, position, positions, scores.into_iter().map(|s| s.unwrap_or(f32::NAN)).collect()));
            }
            TraceLine::Token { position, text } => {
                trace.texts.insert(position, text);
            }
            TraceLine::Figures { figures } => trace.figures = figures,
        }
    }
    Ok(trace)
}
