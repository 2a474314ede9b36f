//! The generation side: a [`SelectionSink`] that turns per-layer records into one
//! [`TokenFrame`] per token for the viewer, and [`GenControl`] for pause/step/stop.
//! Nothing here blocks the generating thread, except a pause the user asked for.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, Sender, TryRecvError};

use k31_engine::trace::{Selection, SelectionSink};

use crate::frame::{Control, LayerFigures, LayerSelection, TokenFrame, ViewerMsg};

/// Collects the selections of one forward step (one token in decode, many in prefill) and
/// sends one frame per position on [`FrameSink::end_step`]. Sends go to unbounded channels,
/// so a slow or closed viewer never stalls generation.
#[derive(Default)]
pub struct FrameSink {
    senders: Vec<Sender<ViewerMsg>>,
    pending: BTreeMap<usize, TokenFrame>,
    /// Layers to read back (None: all).
    pub layers: Option<Vec<usize>>,
    sent: usize,
}

impl FrameSink {
    pub fn new(tx: Sender<ViewerMsg>) -> Self {
        FrameSink { senders: vec![tx], ..Default::default() }
    }

    /// Also feed another consumer (e.g. the window and the PNG exporter at once).
    pub fn add(&mut self, tx: Sender<ViewerMsg>) {
        self.senders.push(tx);
    }

    fn send(&mut self, msg: ViewerMsg) {
        // A consumer that went away is dropped; the others keep receiving.
        self.senders.retain(|tx| tx.send(msg.clone()).is_ok());
    }

    /// Sends the frames of the step that just ran, in position order; `text(pos)` names the
    /// token at each position.
    pub fn end_step(&mut self, text: &dyn Fn(usize) -> String) {
        for (pos, mut frame) in std::mem::take(&mut self.pending) {
            frame.text = text(pos);
            self.sent += 1;
            self.send(ViewerMsg::Frame(Arc::new(frame)));
        }
    }

    pub fn figures(&mut self, figures: Vec<LayerFigures>) {
        self.send(ViewerMsg::Figures(figures));
    }

    /// Flushes anything pending (without text) and tells the consumers generation ended.
    pub fn finish(&mut self) {
        self.end_step(&|_| String::new());
        self.send(ViewerMsg::Done);
    }

    /// Frames sent so far.
    pub fn frames_sent(&self) -> usize {
        self.sent
    }

    /// Whether any consumer is still listening.
    pub fn connected(&self) -> bool {
        !self.senders.is_empty()
    }
}

impl SelectionSink for FrameSink {
    fn wants(&self, layer: usize) -> bool {
        !self.senders.is_empty() && self.layers.as_ref().is_none_or(|l| l.contains(&layer))
    }

    fn record(&mut self, sel: Selection<'_>) {
        let frame = self.pending.entry(sel.position).or_insert_with(|| TokenFrame { position: sel.position, ..Default::default() });
        frame.layers.push(LayerSelection { layer: sel.layer, positions: sel.positions.to_vec(), scores: sel.scores.to_vec() });
    }
}

/// What the generating loop should do next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    Continue,
    Stop,
}

/// The generating thread's end of the viewer's control channel. Call [`GenControl::next_step`]
/// before each token: it returns at once unless the user paused.
pub struct GenControl {
    rx: Receiver<Control>,
    paused: bool,
    steps: usize,
}

impl GenControl {
    pub fn new(rx: Receiver<Control>) -> Self {
        GenControl { rx, paused: false, steps: 0 }
    }

    /// A control channel pair: the sender goes to the viewer.
    pub fn channel() -> (Sender<Control>, GenControl) {
        let (tx, rx) = std::sync::mpsc::channel();
        (tx, GenControl::new(rx))
    }

    fn apply(&mut self, c: Control) -> Option<Flow> {
        match c {
            Control::Pause => self.paused = true,
            Control::Resume => self.paused = false,
            Control::Step => {
                self.paused = true;
                self.steps += 1;
            }
            Control::Stop => return Some(Flow::Stop),
        }
        None
    }

    pub fn is_paused(&self) -> bool {
        self.paused
    }

    /// Whether to generate the next token; blocks only while paused with no step pending.
    /// A viewer that went away without saying Stop lets generation run on.
    pub fn next_step(&mut self) -> Flow {
        loop {
            match self.rx.try_recv() {
                Ok(c) => {
                    if let Some(f) = self.apply(c) {
                        return f;
                    }
                }
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    self.paused = false;
                    break;
                }
            }
        }
        while self.paused {
            if self.steps > 0 {
                self.steps -= 1;
                return Flow::Continue;
            }
            match self.rx.recv() {
                Ok(c) => {
                    if let Some(f) = self.apply(c) {
                        return f;
                    }
                }
                Err(_) => self.paused = false,
            }
        }
        Flow::Continue
    }
}
