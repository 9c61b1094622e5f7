//! Checkpoint journal (being written).
