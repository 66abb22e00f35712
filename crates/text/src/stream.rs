//! Streaming detokenizer: turns generated token ids, one at a time, into the text to print,
//! never printing half of a multi-byte character.
//!
//! Byte-level tokenizers can split one UTF-8 character over several tokens; decoding such a
//! prefix yields U+FFFD. The decoder re-decodes a short window of recent tokens and prints only
//! what the window adds beyond the text already printed, holding the output back while it ends
//! in U+FFFD. Decoding a window (not the whole sequence) keeps each step cheap, and the context
//! token in front of the new ones keeps decoders that treat the first token specially (such as
//! SentencePiece's leading-space removal) from changing the spacing.

use crate::tokenizer::{Tokenizer, TokenizerError};

/// Incremental decoder state for one generated sequence.
#[derive(Debug, Clone)]
pub struct StreamDecoder {
    ids: Vec<u32>,
    /// Start of the window that is decoded for context.
    prefix_offset: usize,
    /// Tokens before this have been printed.
    read_offset: usize,
    skip_special: bool,
}

impl StreamDecoder {
    /// A decoder for a new sequence; `skip_special` leaves out special tokens such as `<|im_end|>`.
    pub fn new(skip_special: bool) -> Self {
        Self { ids: Vec::new(), prefix_offset: 0, read_offset: 0, skip_special }
    }

    /// Adds one token and returns the text that is now complete (possibly empty).
    pub fn push(&mut self, tokenizer: &Tokenizer, id: u32) -> Result<String, TokenizerError> {
        self.ids.push(id);
        let prefix = tokenizer.decode(&self.ids[self.prefix_offset..self.read_offset], self.skip_special)?;
        let full = tokenizer.decode(&self.ids[self.prefix_offset..], self.skip_special)?;
        if full.ends_with('\u{FFFD}') {
            return Ok(String::new());
        }
        // The window's text normally extends the context text; if a decoder rewrote the
        // context, fall back to its length so nothing printed is repeated.
        let new = match full.strip_prefix(&prefix) {
            Some(tail) => tail.to_owned(),
            None => full.get(prefix.len()..).unwrap_or_default().to_owned(),
        };
        if new.is_empty() {
            // A token with no text of its own (a skipped special token): keep it in the window.
            return Ok(String::new());
        }
        self.prefix_offset = self.read_offset;
        self.read_offset = self.ids.len();
        Ok(new)
    }

    /// Text still held back at the end of generation (an incomplete character, shown as U+FFFD).
    pub fn finish(&mut self, tokenizer: &Tokenizer) -> Result<String, TokenizerError> {
        let prefix = tokenizer.decode(&self.ids[self.prefix_offset..self.read_offset], self.skip_special)?;
        let full = tokenizer.decode(&self.ids[self.prefix_offset..], self.skip_special)?;
        self.prefix_offset = self.read_offset;
        self.read_offset = self.ids.len();
        Ok(match full.strip_prefix(&prefix) {
            Some(tail) => tail.to_owned(),
            None => full.get(prefix.len()..).unwrap_or_default().to_owned(),
        })
    }

    /// All ids pushed so far.
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::test_model::{dir, ids, trajectory};

    /// Streams `ids` and returns the printed pieces.
    fn stream(tok: &Tokenizer, ids: &[u32], skip_special: bool) -> Vec<String> {
        let mut dec = StreamDecoder::new(skip_special);
        let mut pieces: Vec<String> = ids.iter().map(|&id| dec.push(tok, id).unwrap()).collect();
        pieces.push(dec.finish(tok).unwrap());
        assert_eq!(dec.ids(), ids);
        pieces
    }

    #[test]
    fn multibyte_characters_split_across_tokens() {
        let tok = Tokenizer::from_dir(&dir()).unwrap();
        let text = "Un café à Tōkyō: 日本語 🦀🎉 naïve.";
        let ids = tok.encode(text, false).unwrap();
        // The text must really split characters over tokens, or the test proves nothing.
        let partial = ids.iter().filter(|&&id| tok.decode(&[id], false).unwrap().contains('\u{FFFD}')).count();
        assert!(partial >= 4, "only {partial} tokens hold partial characters");

        let pieces = stream(&tok, &ids, false);
        assert_eq!(pieces.concat(), text);
        assert!(pieces.iter().all(|p| !p.contains('\u{FFFD}')), "{pieces:?}");
        // Held back: some steps print nothing while a character is incomplete.
        assert!(pieces[..ids.len()].iter().any(String::is_empty), "{pieces:?}");
        assert_eq!(pieces.last().unwrap(), "", "nothing left at the end");
    }

    #[test]
    fn crab_emoji_is_printed_whole() {
        let tok = Tokenizer::from_dir(&dir()).unwrap();
        let ids = tok.encode("🦀", false).unwrap();
        assert!(ids.len() >= 2, "🦀 is {ids:?}");
        let pieces = stream(&tok, &ids, false);
        let (last, before) = pieces[..ids.len()].split_last().unwrap();
        assert!(before.iter().all(String::is_empty), "{pieces:?}");
        assert_eq!(last, "🦀");
    }

    #[test]
    fn incomplete_character_is_flushed_by_finish() {
        let tok = Tokenizer::from_dir(&dir()).unwrap();
        let ids = tok.encode("ok 🦀", false).unwrap();
        let cut = &ids[..ids.len() - 1];
        let pieces = stream(&tok, cut, false);
        let (last, printed) = pieces.split_last().unwrap();
        assert!(printed.concat().starts_with("ok") && !printed.concat().contains('\u{FFFD}'), "{pieces:?}");
        assert!(last.ends_with('\u{FFFD}'), "{pieces:?}");
        assert_eq!(pieces.concat(), tok.decode(cut, false).unwrap());
    }

    #[test]
    fn oracle_continuations_stream_to_the_full_decode() {
        let tok = Tokenizer::from_dir(&dir()).unwrap();
        for kind in ["chat", "raw"] {
            let out = ids(&trajectory(kind)["token_ids"]);
            for skip in [false, true] {
                let pieces = stream(&tok, &out, skip);
                assert_eq!(pieces.concat(), tok.decode(&out, skip).unwrap(), "{kind} skip={skip}");
            }
            // Every token of these English continuations prints at once.
            let pieces = stream(&tok, &out, false);
            assert!(pieces[..out.len()].iter().all(|p| !p.is_empty()), "{kind}: {pieces:?}");
        }
        let chat = ids(&trajectory("chat")["token_ids"]);
        let pieces = stream(&tok, &chat, true);
        assert_eq!(pieces[..7].concat(), "The capital of France is Paris.");
        assert_eq!(pieces[7], "", "<|im_end|> is skipped");
    }
}
