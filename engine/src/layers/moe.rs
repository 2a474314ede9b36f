//! The moe layer (being written: see the open issue).
