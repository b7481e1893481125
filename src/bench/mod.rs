//! The benchmark program.
