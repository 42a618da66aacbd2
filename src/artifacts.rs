//! SPEC §4.3: the artifact store, ids, caps, retention and `artifact://` resolution.

use std::path::{Path, PathBuf};

/// The artifacts directory of one session. Ids are allocated lazily, on the first spill.
#[derive(Debug)]
pub struct ArtifactStore {
    dir: PathBuf,
}

impl ArtifactStore {
    /// A store rooted at `dir`; nothing is created until the first artifact.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
}
