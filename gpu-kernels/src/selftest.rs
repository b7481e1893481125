//! The layout of the architecture self-test's output, shared by the kernel
//! (`kernels::gpumalloc_selftest`) and the host check (`host::selftest`).

/// Words of output per thread of the self-test.
pub const SELFTEST_WORDS: usize = 8;
