//! The provider's key kept out of what the provider says back: a provider
//! that echoes the key it was sent (`invalid x-api-key sk-ant-...`), whole or
//! in the masked forms providers print (`sk-proj-****...abcd`: the first
//! few characters, a mask, the last few), would hand it to the agent. Every
//! relayed error and JSON answer, and every relayed header, passes here.
//!
//! A "word" is a run of key characters (ASCII letters, digits, `-`, `_`)
//! and mask characters (`*`, `.`, `…`). A word is redacted, whole, when it
//! holds the key; when it holds a mask (`**`, `..`, `…`) and a run of at
//! least [`MASKED_RUN`] key characters that is part of the key; or when it
//! holds a run of at least [`BARE_RUN`] key characters that is part of the
//! key. That errs towards redacting: a redacted word in an error costs
//! nothing, a key that leaves costs everything.
//!
//! A stream is scrubbed as it passes ([`StreamScrubber`]): a word that a
//! piece's end cuts is held back until the piece that ends it.

use std::borrow::Cow;

use axum::body::Bytes;
use memchr::memmem;

/// What a redacted word becomes.
const REDACTED: &[u8] = b"[redacted]";

/// The shortest part of the key, beside a mask, that is redacted.
const MASKED_RUN: usize = 4;

/// The shortest part of the key, without a mask, that is redacted.
const BARE_RUN: usize = 12;

/// Longest word a stream's scrubber holds back; a longer one is passed on
/// (scrubbed as far as it goes).
const MAX_HELD: usize = 64 << 10;

/// Scrubs one provider's key from what its answers carry.
#[derive(Clone)]
pub struct Scrubber {
    key: Vec<u8>,
}

impl std::fmt::Debug for Scrubber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Scrubber(<redacted>)")
    }
}

fn key_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'-' || b == b'_'
}

/// `*`, `.`, and the bytes of `…` (U+2026, E2 80 A6).
fn mask_char(b: u8) -> bool {
    matches!(b, b'*' | b'.' | 0xE2 | 0x80 | 0xA6)
}

/// Whether `b` may be part of a word.
fn word_byte(b: u8) -> bool {
    key_char(b) || mask_char(b)
}

fn has_mask(word: &[u8]) -> bool {
    word.windows(2).any(|w| w == b"**" || w == b"..")
        || memmem::find(word, "…".as_bytes()).is_some()
}

impl Scrubber {
    pub fn new(key: &str) -> Scrubber {
        Scrubber {
            key: key.as_bytes().to_vec(),
        }
    }

    fn part_of_key(&self, run: &[u8]) -> bool {
        memmem::find(&self.key, run).is_some()
    }

    /// Whether `word` shows the key or a part of it.
    fn word_reveals(&self, word: &[u8]) -> bool {
        if memmem::find(word, &self.key).is_some() {
            return true;
        }
        let masked = has_mask(word);
        word.split(|b| !key_char(*b)).any(|run| {
            let least = if masked { MASKED_RUN } else { BARE_RUN };
            run.len() >= least && self.part_of_key(run)
        })
    }

    /// `text` with every word that shows the key redacted; borrowed as it
    /// is when there is none.
    pub fn scrub<'a>(&self, text: &'a [u8]) -> Cow<'a, [u8]> {
        // The key may hold characters no word does: take it out whole first.
        let whole: Cow<'a, [u8]> = if memmem::find(text, &self.key).is_some() {
            let mut out = Vec::with_capacity(text.len());
            let mut rest = text;
            while let Some(at) = memmem::find(rest, &self.key) {
                out.extend_from_slice(&rest[..at]);
                out.extend_from_slice(REDACTED);
                rest = &rest[at + self.key.len()..];
            }
            out.extend_from_slice(rest);
            Cow::Owned(out)
        } else {
            Cow::Borrowed(text)
        };
        let mut out: Option<Vec<u8>> = None;
        let mut at = 0;
        let bytes: &[u8] = &whole;
        while at < bytes.len() {
            if !word_byte(bytes[at]) {
                if let Some(out) = &mut out {
                    out.push(bytes[at]);
                }
                at += 1;
                continue;
            }
            let end = bytes[at..]
                .iter()
                .position(|b| !word_byte(*b))
                .map_or(bytes.len(), |n| at + n);
            let word = &bytes[at..end];
            if self.word_reveals(word) {
                let out = out.get_or_insert_with(|| bytes[..at].to_vec());
                out.extend_from_slice(REDACTED);
            } else if let Some(out) = &mut out {
                out.extend_from_slice(word);
            }
            at = end;
        }
        match (out, whole) {
            (Some(out), _) => Cow::Owned(out),
            (None, whole) => whole,
        }
    }

    /// Whether `text` shows the key or a part of it.
    pub fn reveals(&self, text: &[u8]) -> bool {
        matches!(self.scrub(text), Cow::Owned(_))
    }
}

/// Scrubs a stream piece by piece. A piece passes as it is (no copy) when
/// it shows nothing of the key and ends between words.
#[derive(Debug)]
pub struct StreamScrubber {
    scrubber: Scrubber,
    /// The start of a word the last piece's end cut.
    held: Vec<u8>,
}

impl StreamScrubber {
    pub fn new(scrubber: Scrubber) -> StreamScrubber {
        StreamScrubber {
            scrubber,
            held: Vec::new(),
        }
    }

    fn scrubbed(&self, text: Bytes) -> Bytes {
        match self.scrubber.scrub(&text) {
            Cow::Borrowed(_) => text,
            Cow::Owned(out) => {
                tracing::warn!("a provider's stream held its key: scrubbed");
                Bytes::from(out)
            }
        }
    }

    /// The next piece of the stream: what of it (and of the word held
    /// before it) is whole, scrubbed; possibly nothing.
    pub fn pass(&mut self, piece: Bytes) -> Bytes {
        let cut = piece
            .iter()
            .rposition(|b| !word_byte(*b))
            .map_or(0, |at| at + 1);
        if cut == 0 {
            // One word still: held, unless it has grown past the bound.
            self.held.extend_from_slice(&piece);
            if self.held.len() <= MAX_HELD {
                return Bytes::new();
            }
            return self.rest();
        }
        let ready = if self.held.is_empty() {
            piece.slice(..cut)
        } else {
            let mut joined = std::mem::take(&mut self.held);
            joined.extend_from_slice(&piece[..cut]);
            Bytes::from(joined)
        };
        self.held.extend_from_slice(&piece[cut..]);
        self.scrubbed(ready)
    }

    /// What is held at the stream's end, scrubbed.
    pub fn rest(&mut self) -> Bytes {
        let held = Bytes::from(std::mem::take(&mut self.held));
        self.scrubbed(held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "sk-proj-Abc123Def456Ghi789Jkl012Mno345Pqr678";

    fn scrubbed(text: &str) -> String {
        String::from_utf8(Scrubber::new(KEY).scrub(text.as_bytes()).into_owned()).unwrap()
    }

    #[test]
    fn the_key_and_its_masked_forms_are_redacted() {
        let cases = [
            format!("invalid x-api-key {KEY}"),
            format!("{{\"message\":\"Incorrect API key provided: {KEY}.\"}}"),
            "Incorrect API key provided: sk-proj-********************************r678.".to_owned(),
            "key sk-proj-Abc1...r678 is not valid".to_owned(),
            "key sk-...Pqr678 is not valid".to_owned(),
            "key ****r678 is not valid".to_owned(),
            "key sk-proj-Abc…r678 is not valid".to_owned(),
            "key Abc123Def456Ghi7 (a part) is not valid".to_owned(),
            format!("Bearer{KEY}glued"),
        ];
        for text in cases {
            let out = scrubbed(&text);
            assert!(out.contains("[redacted]"), "{text} -> {out}");
            for part in ["Abc1", "r678", "Abc123Def456"] {
                assert!(!out.contains(part), "{part} left in {out}");
            }
        }
    }

    #[test]
    fn a_stream_is_scrubbed_however_its_pieces_cut_the_key() {
        let stream = format!("data: {{\"text\": \"key {KEY} and sk-proj-Abc...r678.\"}}\n\n");
        for cut in 0..stream.len() {
            for second in cut..stream.len() {
                let mut s = StreamScrubber::new(Scrubber::new(KEY));
                let mut out = Vec::new();
                for piece in [&stream[..cut], &stream[cut..second], &stream[second..]] {
                    out.extend_from_slice(&s.pass(Bytes::copy_from_slice(piece.as_bytes())));
                }
                out.extend_from_slice(&s.rest());
                let out = String::from_utf8(out).unwrap();
                assert_eq!(
                    out, "data: {\"text\": \"key [redacted] and [redacted]\"}\n\n",
                    "cut at {cut} and {second}"
                );
            }
        }
        let mut s = StreamScrubber::new(Scrubber::new(KEY));
        let plain = Bytes::from_static(b"data: {\"text\": \"hello\"}\n\n");
        let out = s.pass(plain.clone());
        assert_eq!(out.as_ptr(), plain.as_ptr(), "passed on without a copy");
    }

    #[test]
    fn text_without_the_key_is_left_as_it_is() {
        for text in [
            "{\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded...\"}}",
            "rate limited: retry in 3.5 s",
            "sk-ant-other...wxyz",
        ] {
            assert!(
                matches!(Scrubber::new(KEY).scrub(text.as_bytes()), Cow::Borrowed(_)),
                "{text}"
            );
        }
        assert!(!format!("{:?}", Scrubber::new(KEY)).contains("Abc"));
    }
}
