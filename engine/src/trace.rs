//! The selection sink: every global layer reports, per token, which cache positions its
//! top-k selection read and their indexer scores (for the viewer, `--selection-trace`, and
//! tests). Cheap when nobody listens: a layer reads the selection back from the GPU only when
//! a sink is attached and [`SelectionSink::wants`] the layer.

/// One token's selection in one global layer (positions in rank order: score descending,
/// then position ascending).
#[derive(Clone, Copy, Debug)]
pub struct Selection<'a> {
    /// Index of the layer in the model (0-based).
    pub layer: usize,
    /// Absolute position of the query token.
    pub position: usize,
    pub positions: &'a [i32],
    pub scores: &'a [f32],
}

pub trait SelectionSink {
    /// Whether `layer`'s selections are wanted (false: the layer skips the readback).
    fn wants(&self, _layer: usize) -> bool {
        true
    }
    fn record(&mut self, sel: Selection<'_>);
}

/// `sink` reborrowed for a shorter lifetime, to hand to one forward or layer: `as_deref_mut`
/// would keep the trait object's own lifetime (invariant behind `&mut`) and not compile there.
pub fn reborrow<'s>(sink: &'s mut Option<&mut dyn SelectionSink>) -> Option<&'s mut dyn SelectionSink> {
    sink.as_mut().map(|s| -> &mut dyn SelectionSink { &mut **s })
}

/// An owned copy of one selection.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Record {
    pub layer: usize,
    pub position: usize,
    pub positions: Vec<i32>,
    pub scores: Vec<f32>,
}

/// A sink that keeps every selection in memory (tests, file export).
#[derive(Clone, Debug, Default)]
pub struct Recorder {
    pub records: Vec<Record>,
    /// Only these layers (None: all).
    pub layers: Option<Vec<usize>>,
}

impl SelectionSink for Recorder {
    fn wants(&self, layer: usize) -> bool {
        self.layers.as_ref().is_none_or(|l| l.contains(&layer))
    }
    fn record(&mut self, s: Selection<'_>) {
        self.records.push(Record { layer: s.layer, position: s.position, positions: s.positions.to_vec(), scores: s.scores.to_vec() });
    }
}
