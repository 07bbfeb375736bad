//! Finding the last complete line of a log by reading backwards from the end, never the whole file.
//!
//! Open and append only need the last record's `sha256`, so their cost must not grow with the log.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};

/// The first read from the end; one block usually holds the whole last line.
const FIRST_CHUNK: u64 = 8 * 1024;

/// The end of a log as found by [`read_tail`].
#[derive(Debug)]
pub(crate) struct Tail {
    /// Offset just past the last `\n`: the length of the log's complete lines.
    pub(crate) complete_len: u64,
    /// The last complete line, without its `\n`; `None` when the file has no complete line.
    pub(crate) last_line: Option<Vec<u8>>,
    /// Bytes after the last `\n`, left by a write that was interrupted. Empty for a healthy log.
    pub(crate) torn: Vec<u8>,
}

/// Why the tail could not be read.
#[derive(Debug)]
pub(crate) enum TailError {
    Io(io::Error),
    /// No line boundary where one must be: the file is not a log written by us.
    NoBoundary {
        limit: u64,
    },
}

impl From<io::Error> for TailError {
    fn from(e: io::Error) -> Self {
        TailError::Io(e)
    }
}

/// Reads the last complete line and any torn bytes of the first `len` bytes of `file`.
///
/// Reads backwards in growing chunks until it has seen the final `\n` and the one before it, so the
/// amount read is about one line in the common case and at most `2 * max_line` in any case.
pub(crate) fn read_tail(file: &File, len: u64, max_line: u64) -> Result<Tail, TailError> {
    let mut start = len;
    // `buf` always holds the bytes `start..len` of the file.
    let mut buf: Vec<u8> = Vec::new();
    loop {
        let at_start = start == 0;
        if let Some(tail) = analyze(&buf, start, at_start, max_line)? {
            return Ok(tail);
        }
        // analyze() returns a tail whenever the whole file is in `buf`, so here start > 0.
        let have = len - start;
        let want = have.max(FIRST_CHUNK).min(start);
        let new_start = start - want;
        let mut chunk = vec![
            0u8;
            usize::try_from(want)
                .map_err(|_| TailError::NoBoundary { limit: max_line })?
        ];
        let mut reader = file;
        reader.seek(SeekFrom::Start(new_start))?;
        reader.read_exact(&mut chunk)?;
        chunk.extend_from_slice(&buf);
        buf = chunk;
        start = new_start;
    }
}

/// Finds the tail inside `buf` (the file's bytes from `start` to its end), or `None` if more bytes
/// from before `start` are needed.
fn analyze(
    buf: &[u8],
    start: u64,
    at_start: bool,
    max_line: u64,
) -> Result<Option<Tail>, TailError> {
    let too_long = |n: usize| u64::try_from(n).map_or(true, |n| n > max_line);
    let Some(last_nl) = buf.iter().rposition(|&b| b == b'\n') else {
        if at_start {
            if too_long(buf.len()) {
                return Err(TailError::NoBoundary { limit: max_line });
            }
            return Ok(Some(Tail {
                complete_len: 0,
                last_line: None,
                torn: buf.to_vec(),
            }));
        }
        if too_long(buf.len()) {
            return Err(TailError::NoBoundary { limit: max_line });
        }
        return Ok(None);
    };
    let torn = &buf[last_nl + 1..];
    if too_long(torn.len()) {
        return Err(TailError::NoBoundary { limit: max_line });
    }
    let line_start = match buf[..last_nl].iter().rposition(|&b| b == b'\n') {
        Some(prev_nl) => prev_nl + 1,
        None if at_start => 0,
        None => {
            if too_long(last_nl) {
                return Err(TailError::NoBoundary { limit: max_line });
            }
            return Ok(None);
        }
    };
    let line = &buf[line_start..last_nl];
    if too_long(line.len() + 1) {
        return Err(TailError::NoBoundary { limit: max_line });
    }
    let complete_len = start
        + u64::try_from(last_nl + 1).map_err(|_| TailError::NoBoundary { limit: max_line })?;
    Ok(Some(Tail {
        complete_len,
        last_line: Some(line.to_vec()),
        torn: torn.to_vec(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn tail_of(content: &[u8], max_line: u64) -> Result<Tail, TailError> {
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(content).unwrap();
        read_tail(&file, content.len() as u64, max_line)
    }

    #[test]
    fn finds_last_line_and_torn_bytes() {
        let t = tail_of(b"a\nbb\nccc", 100).unwrap();
        assert_eq!(t.complete_len, 5);
        assert_eq!(t.last_line.as_deref(), Some(&b"bb"[..]));
        assert_eq!(t.torn, b"ccc");

        let t = tail_of(b"a\nbb\n", 100).unwrap();
        assert_eq!(t.complete_len, 5);
        assert_eq!(t.last_line.as_deref(), Some(&b"bb"[..]));
        assert!(t.torn.is_empty());

        let t = tail_of(b"only\n", 100).unwrap();
        assert_eq!(t.last_line.as_deref(), Some(&b"only"[..]));

        let t = tail_of(b"partial", 100).unwrap();
        assert_eq!(t.complete_len, 0);
        assert!(t.last_line.is_none());
        assert_eq!(t.torn, b"partial");

        let t = tail_of(b"", 100).unwrap();
        assert_eq!(t.complete_len, 0);
        assert!(t.last_line.is_none());
    }

    #[test]
    fn lines_longer_than_one_chunk_are_found() {
        let long = vec![b'x'; 50_000];
        let mut content = b"first\n".to_vec();
        content.extend_from_slice(&long);
        content.push(b'\n');
        content.extend_from_slice(&long[..20_000]);
        let t = tail_of(&content, 100_000).unwrap();
        assert_eq!(t.last_line.as_deref(), Some(&long[..]));
        assert_eq!(t.torn.len(), 20_000);
        assert_eq!(t.complete_len, 6 + 50_001);
    }

    #[test]
    fn no_boundary_within_the_limit_is_an_error() {
        let content = vec![b'y'; 10_000];
        assert!(matches!(
            tail_of(&content, 100),
            Err(TailError::NoBoundary { .. })
        ));
        let mut content = vec![b'y'; 10_000];
        content.push(b'\n');
        assert!(matches!(
            tail_of(&content, 100),
            Err(TailError::NoBoundary { .. })
        ));
    }
}
