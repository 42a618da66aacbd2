//! SPEC §7: `BashResult` and the model-facing text (notices, exit-code wording).
