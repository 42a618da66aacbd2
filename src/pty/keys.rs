//! Keys typed in a terminal view, rewritten into the bytes the program in the PTY expects
//! (contract §6).
//!
//! The input is what the user's terminal (Neovim's terminal buffer) produced: plain bytes, legacy
//! escape sequences (`ESC [ A`), and possibly Kitty keyboard-protocol sequences (`CSI 97;5u`),
//! which programs that did not ask for that protocol cannot read. The rules:
//! - Kitty release events (`…:3u`, `…;1:3A`) produce no bytes;
//! - Kitty `CSI … u` keys become legacy bytes: ctrl+letter the control code, alt an `ESC`
//!   prefix, printable characters themselves, Enter `\r`, Tab `\t`, shift+Tab `ESC [ Z`,
//!   Backspace `\x7f`, Escape `ESC`;
//! - unmodified arrows, Home and End follow the program's cursor-key mode: `ESC O A` when it
//!   turned on application cursor keys, `ESC [ A` otherwise, whichever form was typed;
//! - PageUp/PageDown/Insert/Delete are `ESC [ 5~`/`6~`/`2~`/`3~` (Kitty's event field dropped);
//! - anything else (text, bracketed paste, mouse reports, unknown sequences) passes unchanged.
//!
//! # Caveats
//! Each chunk is rewritten on its own: a sequence cut between two chunks passes through as typed.
//! Holding back an incomplete sequence would also hold back a lone Escape key press until the next
//! key, which is worse; a terminal delivers one key press per chunk.

const ESC: u8 = 0x1b;

/// Kitty's event type for a key release (`CSI code ; mods:3 u`).
const EVENT_RELEASE: u32 = 3;
/// Kitty's private-use code points for keypad keys: `KP_0` … `KP_9`.
const KP_0: u32 = 57399;
const KP_9: u32 = 57408;
/// First and last of Kitty's private-use key codes (keypad, media, modifier keys).
const KITTY_PUA: std::ops::RangeInclusive<u32> = 57344..=63743;

/// Rewrites one chunk of typed input. `app_cursor` is the program's cursor-key mode
/// ([`super::screen::Screen::application_cursor`]).
pub fn normalize(input: &[u8], app_cursor: bool, out: &mut Vec<u8>) {
    let mut i = 0;
    while i < input.len() {
        if input[i] != ESC || i + 1 >= input.len() {
            out.push(input[i]);
            i += 1;
            continue;
        }
        match input[i + 1] {
            b'[' => match csi_end(input, i + 2) {
                Some(end) => {
                    let seq = &input[i..end];
                    if !rewrite_csi(seq, app_cursor, out) {
                        out.extend_from_slice(seq);
                    }
                    i = end;
                }
                None => {
                    out.extend_from_slice(&input[i..]);
                    return;
                }
            },
            // SS3 cursor keys, as a terminal in application mode sends them.
            b'O' if i + 2 < input.len() && is_cursor_final(input[i + 2]) => {
                cursor_key(input[i + 2], 1, app_cursor, out);
                i += 3;
            }
            _ => {
                out.push(ESC);
                i += 1;
            }
        }
    }
}

/// Index just past the final byte of a CSI sequence whose parameters start at `from`.
fn csi_end(input: &[u8], from: usize) -> Option<usize> {
    input[from..].iter().position(|b| (0x40..=0x7e).contains(b)).map(|p| from + p + 1)
}

fn is_cursor_final(b: u8) -> bool {
    matches!(b, b'A' | b'B' | b'C' | b'D' | b'H' | b'F')
}

/// The fields of a CSI sequence: `;`-separated, each a list of `:`-separated numbers
/// (an empty number is `None`).
type Fields = Vec<Vec<Option<u32>>>;

fn parse_fields(params: &[u8]) -> Option<Fields> {
    let text = std::str::from_utf8(params).ok()?;
    text.split(';')
        .map(|field| {
            field
                .split(':')
                .map(|n| if n.is_empty() { Ok(None) } else { n.parse::<u32>().map(Some) })
                .collect::<Result<Vec<_>, _>>()
                .ok()
        })
        .collect()
}

fn field(fields: &Fields, i: usize, sub: usize) -> Option<u32> {
    fields.get(i).and_then(|f| f.get(sub).copied().flatten())
}

/// Writes the replacement of a CSI sequence; `false` means "pass it unchanged".
fn rewrite_csi(seq: &[u8], app_cursor: bool, out: &mut Vec<u8>) -> bool {
    let Some((&fin, body)) = seq[2..].split_last() else { return false };
    // Private markers (`<` mouse, `?`) and intermediates are not key sequences we rewrite.
    if body.iter().any(|b| !(b.is_ascii_digit() || *b == b';' || *b == b':')) {
        return false;
    }
    let Some(fields) = parse_fields(body) else { return false };
    let mods = field(&fields, 1, 0).unwrap_or(1);
    let event = field(&fields, 1, 1).unwrap_or(1);
    if event == EVENT_RELEASE {
        return true;
    }
    match fin {
        b'u' => kitty_key(&fields, mods, out),
        f if is_cursor_final(f) => cursor_key(f, mods, app_cursor, out),
        b'~' => match field(&fields, 0, 0) {
            // Home and End in their `~` forms (rxvt, linux console).
            Some(1 | 7) => cursor_key(b'H', mods, app_cursor, out),
            Some(4 | 8) => cursor_key(b'F', mods, app_cursor, out),
            // Bracketed paste markers are not keys.
            Some(200 | 201) | None => return false,
            Some(n) => tilde_key(n, mods, out),
        },
        // F1–F4 in their modified CSI form; the unmodified form is SS3.
        b'P' | b'Q' | b'R' | b'S' if fields.len() >= 2 => {
            if mods > 1 {
                out.extend_from_slice(format!("\x1b[1;{mods}").as_bytes());
                out.push(fin);
            } else {
                out.extend_from_slice(&[ESC, b'O', fin]);
            }
        }
        _ => return false,
    }
    true
}

/// An arrow, Home or End. Modified keys keep the xterm form `ESC [ 1 ; mods X`, which does not
/// depend on the cursor-key mode.
fn cursor_key(fin: u8, mods: u32, app_cursor: bool, out: &mut Vec<u8>) {
    if mods > 1 {
        out.extend_from_slice(format!("\x1b[1;{mods}").as_bytes());
        out.push(fin);
    } else if app_cursor {
        out.extend_from_slice(&[ESC, b'O', fin]);
    } else {
        out.extend_from_slice(&[ESC, b'[', fin]);
    }
}

fn tilde_key(n: u32, mods: u32, out: &mut Vec<u8>) {
    let seq = if mods > 1 { format!("\x1b[{n};{mods}~") } else { format!("\x1b[{n}~") };
    out.extend_from_slice(seq.as_bytes());
}

/// A Kitty `CSI code[:shifted[:base]] ; mods[:event] ; text u` key as legacy bytes.
fn kitty_key(fields: &Fields, mods: u32, out: &mut Vec<u8>) {
    let Some(code) = field(fields, 0, 0) else { return };
    let bits = mods.saturating_sub(1);
    let (shift, alt, ctrl) = (bits & 1 != 0, bits & 2 != 0, bits & 4 != 0);
    let mut bytes: Vec<u8> = Vec::new();
    match code {
        13 => bytes.push(b'\r'),
        9 if shift => bytes.extend_from_slice(b"\x1b[Z"),
        9 => bytes.push(b'\t'),
        // ctrl+Backspace is ^H in xterm's legacy encoding.
        127 | 8 => bytes.push(if ctrl { 0x08 } else { 0x7f }),
        27 => bytes.push(ESC),
        KP_0..=KP_9 => bytes.push(b'0' + (code - KP_0) as u8),
        57409 => bytes.push(b'.'),
        57410 => bytes.push(b'/'),
        57411 => bytes.push(b'*'),
        57412 => bytes.push(b'-'),
        57413 => bytes.push(b'+'),
        57414 => bytes.push(b'\r'),
        57415 => bytes.push(b'='),
        // Other private-use keys (modifiers alone, media keys) have no legacy bytes.
        c if KITTY_PUA.contains(&c) => {}
        c => {
            let Some(ch) = char::from_u32(c).filter(|ch| !ch.is_control()) else { return };
            if ctrl {
                match ctrl_code(ch) {
                    Some(b) => bytes.push(b),
                    None => push_char(&mut bytes, ch),
                }
            } else {
                let text: Option<String> = fields.get(2).map(|cps| {
                    cps.iter().filter_map(|c| c.and_then(char::from_u32)).collect::<String>()
                });
                match text.filter(|t| !t.is_empty()) {
                    Some(t) => bytes.extend_from_slice(t.as_bytes()),
                    None if shift => {
                        let shifted = field(fields, 0, 1).and_then(char::from_u32);
                        push_char(&mut bytes, shifted.unwrap_or(ch.to_ascii_uppercase()));
                    }
                    None => push_char(&mut bytes, ch),
                }
            }
        }
    }
    if alt && !bytes.is_empty() {
        out.push(ESC);
    }
    out.extend_from_slice(&bytes);
}

fn push_char(out: &mut Vec<u8>, ch: char) {
    let mut buf = [0u8; 4];
    out.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
}

/// The control code of ctrl+`ch` in the legacy encoding, for the keys that have one.
fn ctrl_code(ch: char) -> Option<u8> {
    Some(match ch {
        'a'..='z' | 'A'..='Z' => (ch as u8) & 0x1f,
        '@' | ' ' | '2' => 0x00,
        '[' | '3' => 0x1b,
        '\\' | '4' => 0x1c,
        ']' | '5' => 0x1d,
        '^' | '6' => 0x1e,
        '_' | '/' | '7' | '-' => 0x1f,
        '?' | '8' => 0x7f,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(input: &[u8], app: bool) -> Vec<u8> {
        let mut out = Vec::new();
        normalize(input, app, &mut out);
        out
    }

    #[test]
    fn keys_plain_text_passes() {
        assert_eq!(n(b"alice\r", false), b"alice\r");
        assert_eq!(n("héllo".as_bytes(), true), "héllo".as_bytes());
        assert_eq!(n(b"\x1b", false), b"\x1b");
        assert_eq!(n(b"\x1bx", false), b"\x1bx");
        assert_eq!(n(b"\x1b[200~paste\x1b[201~", false), b"\x1b[200~paste\x1b[201~");
        assert_eq!(n(b"\x1b[<0;3;4M", false), b"\x1b[<0;3;4M");
        assert_eq!(n(b"\x1b[12", false), b"\x1b[12");
    }

    #[test]
    fn keys_cursor_follow_mode() {
        assert_eq!(n(b"\x1b[A", true), b"\x1bOA");
        assert_eq!(n(b"\x1b[A", false), b"\x1b[A");
        assert_eq!(n(b"\x1bOB", false), b"\x1b[B");
        assert_eq!(n(b"\x1bOH", true), b"\x1bOH");
        assert_eq!(n(b"\x1b[1~", true), b"\x1bOH");
        assert_eq!(n(b"\x1b[4~", false), b"\x1b[F");
        assert_eq!(n(b"\x1b[1;5C", true), b"\x1b[1;5C");
        assert_eq!(n(b"\x1b[1;1:1D", true), b"\x1bOD");
    }

    #[test]
    fn keys_editing_keys() {
        assert_eq!(n(b"\x1b[5~\x1b[6~\x1b[2~\x1b[3~", false), b"\x1b[5~\x1b[6~\x1b[2~\x1b[3~");
        assert_eq!(n(b"\x1b[5;1:2~", false), b"\x1b[5~");
        assert_eq!(n(b"\x1b[3;5~", false), b"\x1b[3;5~");
        assert_eq!(n(b"\x1b[Z", false), b"\x1b[Z");
    }

    #[test]
    fn keys_kitty_release_dropped() {
        assert_eq!(n(b"\x1b[97;1:3u", false), b"");
        assert_eq!(n(b"\x1b[1;1:3A", true), b"");
        assert_eq!(n(b"\x1b[5;1:3~", false), b"");
        assert_eq!(n(b"a\x1b[97;1:3ub", false), b"ab");
    }

    #[test]
    fn keys_kitty_to_legacy() {
        assert_eq!(n(b"\x1b[97u", false), b"a");
        assert_eq!(n(b"\x1b[97;1:1u", false), b"a");
        assert_eq!(n(b"\x1b[97;1:2u", false), b"a");
        assert_eq!(n(b"\x1b[97;5u", false), [0x01]);
        assert_eq!(n(b"\x1b[99;5u", false), [0x03]);
        assert_eq!(n(b"\x1b[97;3u", false), b"\x1ba");
        assert_eq!(n(b"\x1b[97;7u", false), b"\x1b\x01");
        assert_eq!(n(b"\x1b[97;2u", false), b"A");
        assert_eq!(n(b"\x1b[49:33;2u", false), b"!");
        assert_eq!(n(b"\x1b[97;2;65u", false), b"A");
        assert_eq!(n(b"\x1b[13u", false), b"\r");
        assert_eq!(n(b"\x1b[9u", false), b"\t");
        assert_eq!(n(b"\x1b[9;2u", false), b"\x1b[Z");
        assert_eq!(n(b"\x1b[127u", false), [0x7f]);
        assert_eq!(n(b"\x1b[27u", false), [0x1b]);
        assert_eq!(n(b"\x1b[233u", false), "é".as_bytes());
        assert_eq!(n(b"\x1b[57399u\x1b[57414u", false), b"0\r");
        assert_eq!(n(b"\x1b[57441;2u", false), b"");
    }
}
