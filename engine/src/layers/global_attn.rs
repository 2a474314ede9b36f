//! The global_attn layer (being written: see the open issue).
