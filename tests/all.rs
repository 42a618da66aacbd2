//! The one integration-test binary: every suite lives in `tests/suite/`.
#![allow(clippy::unwrap_used, clippy::expect_used)]
// test helpers fail loudly
// Test threads block freely: files and processes set up and checked from the test itself.
#![allow(clippy::disallowed_methods)]

mod suite;
