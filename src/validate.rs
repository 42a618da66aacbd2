//! SPEC §3: working directory resolution and timeout validation (pure apart from `stat`).
