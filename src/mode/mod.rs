//! Entry points: each mode decodes its input, calls the library, and encodes the answer.

pub mod explain;
pub mod sanitize;
