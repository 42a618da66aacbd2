//! The one integration-test binary: every suite lives in `tests/suite/`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers fail loudly

mod suite;
