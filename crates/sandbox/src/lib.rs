//! Confinement (being written).
