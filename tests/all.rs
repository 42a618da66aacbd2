//! The one integration-test binary: every suite lives in `tests/suite/`.

mod suite;
