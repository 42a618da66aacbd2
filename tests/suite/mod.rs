//! Integration suites, one file per area.
