//! CPU reference of the moe ops (being written: see the open issue).
