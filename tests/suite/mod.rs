//! Integration suites, one file per area.

mod explain;
