//! Text from elsewhere made safe to show: terminal escape sequences and
//! control characters removed (newlines and tabs kept), and bounded.

/// Removes ANSI escape sequences (CSI `ESC [ … final`, OSC `ESC ] … BEL/ST`,
/// and two-byte `ESC x`) and every other control character but `\n` and
/// `\t`. Carriage returns become newlines.
pub fn strip(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\u{1b}' => match chars.next() {
                Some('[') => {
                    // Parameters and intermediates, then one final byte.
                    for c in chars.by_ref() {
                        if ('\u{40}'..='\u{7e}').contains(&c) {
                            break;
                        }
                    }
                }
                Some(']') => {
                    while let Some(c) = chars.next() {
                        if c == '\u{7}' {
                            break;
                        }
                        if c == '\u{1b}' && chars.peek() == Some(&'\\') {
                            chars.next();
                            break;
                        }
                    }
                }
                _ => {}
            },
            '\r' => {
                if chars.peek() != Some(&'\n') {
                    out.push('\n');
                }
            }
            '\n' | '\t' => out.push(c),
            c if c.is_control() => {}
            // Bidirectional overrides and zero-width characters can make
            // text read differently from what it is.
            '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{200b}'..='\u{200f}' => {}
            c => out.push(c),
        }
    }
    out
}

/// [`strip`]ped, then at most `max` bytes from the start; true when cut.
pub fn clean(s: &str, max: usize) -> (String, bool) {
    let mut t = strip(s);
    if t.len() <= max {
        return (t, false);
    }
    let mut end = max;
    while !t.is_char_boundary(end) {
        end -= 1;
    }
    t.truncate(end);
    (t, true)
}

/// [`strip`]ped, then at most `max` bytes from the end (the end of a log
/// names the failure); true when cut.
pub fn clean_tail(s: &str, max: usize) -> (String, bool) {
    let t = strip(s);
    if t.len() <= max {
        return (t, false);
    }
    let mut start = t.len() - max;
    while !t.is_char_boundary(start) {
        start += 1;
    }
    (t[start..].to_owned(), true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_and_control_characters_go_newlines_stay() {
        let s =
            "\u{1b}[31mFAIL\u{1b}[0m: x\r\n\u{7}bell\u{0}\u{8}\u{1b}]0;title\u{7}ok\tend\u{202e}";
        assert_eq!(
            strip(s),
            "FAIL: x\nbell\u{0}".replace('\u{0}', "") + "ok\tend"
        );
    }

    #[test]
    fn bounds_cut_at_character_boundaries() {
        let (s, cut) = clean("ééé", 3);
        assert_eq!((s.as_str(), cut), ("é", true));
        let (s, cut) = clean_tail("abcdé", 3);
        assert_eq!((s.as_str(), cut), ("dé", true));
        assert_eq!(clean("ab", 3), ("ab".into(), false));
    }
}
