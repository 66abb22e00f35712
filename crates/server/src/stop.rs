//! Stop strings over streamed text: text is released as soon as it cannot be the start of a
//! stop string, and everything from the first stop string on is never sent.

/// Holds back the text that may still turn into a stop string.
#[derive(Debug, Clone, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
}

impl StopMatcher {
    /// Empty stop strings are ignored (they would stop before the first character).
    pub fn new(stops: Vec<String>) -> StopMatcher {
        StopMatcher { stops: stops.into_iter().filter(|s| !s.is_empty()).collect(), held: String::new() }
    }

    /// Adds `text`; returns what can be sent now, and whether a stop string was reached (then
    /// nothing more is to be sent).
    pub fn push(&mut self, text: &str) -> (String, bool) {
        self.held.push_str(text);
        let first = self.stops.iter().filter_map(|s| self.held.find(s.as_str())).min();
        if let Some(at) = first {
            let out = self.held[..at].to_owned();
            self.held.clear();
            return (out, true);
        }
        // Keep the longest tail that some stop string starts with.
        let keep = self
            .held
            .char_indices()
            .map(|(i, _)| i)
            .find(|&i| self.stops.iter().any(|s| s.starts_with(&self.held[i..])))
            .unwrap_or(self.held.len());
        let out = self.held[..keep].to_owned();
        self.held.drain(..keep);
        (out, false)
    }

    /// The text held at the end of generation (it never became a stop string).
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::StopMatcher;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let mut m = StopMatcher::new(stops.iter().map(|s| (*s).to_owned()).collect());
        let mut out = String::new();
        for p in pieces {
            let (text, stopped) = m.push(p);
            out.push_str(&text);
            if stopped {
                return (out, true);
            }
        }
        out.push_str(&m.finish());
        (out, false)
    }

    #[test]
    fn stops_across_pieces_and_holds_only_possible_starts() {
        assert_eq!(run(&["\n\n"], &["Paris", ".\n", "\nThe"]), ("Paris.".to_owned(), true));
        assert_eq!(run(&["END"], &["the E", "ND is"]), ("the ".to_owned(), true));
        assert_eq!(run(&["END"], &["the E", "nd is"]), ("the End is".to_owned(), false));
        assert_eq!(run(&[], &["a", "b"]), ("ab".to_owned(), false));
        assert_eq!(run(&[""], &["a"]), ("a".to_owned(), false));
        // The earliest of several stop strings wins; multi-byte text is cut on characters.
        assert_eq!(run(&["é!", "b"], &["aé", "!b"]), ("a".to_owned(), true));
        let mut m = StopMatcher::new(vec!["xy".into()]);
        assert_eq!(m.push("abx"), ("ab".to_owned(), false));
        assert_eq!(m.push("z"), ("xz".to_owned(), false));
    }
}
