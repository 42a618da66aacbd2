//! SPEC §4.1: incremental UTF-8 decoding, a stateful ANSI/control stripper, CR-overwrite
//! semantics, and SGR colour spans for display.

use serde::Serialize;

/// A colour from an SGR sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Color {
    /// 0–15 are the basic and bright colours, 16–255 the xterm palette.
    Indexed(u8),
    Rgb(u8, u8, u8),
}

/// Text attributes in effect for a span.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct Style {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fg: Option<Color>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bg: Option<Color>,
    pub bold: bool,
    pub dim: bool,
    pub italic: bool,
    pub underline: bool,
    pub reverse: bool,
    pub strikethrough: bool,
}

/// A styled byte range `[start, end)` of the text a [`Sanitizer`] appended to its output string.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Span {
    pub start: usize,
    pub end: usize,
    pub style: Style,
}
