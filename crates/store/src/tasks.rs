//! Task store (being written).
