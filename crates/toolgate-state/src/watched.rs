//! A small operator file re-read so that an edit takes effect on the next call (the rights file,
//! the Cedar entities file): opened and `fstat`ed on every load, parsed again only when it
//! changed.
//!
//! The parsed file is reused only when the stamp (device, inode, size, mtime and, on Unix, ctime)
//! equals the cached one **and** neither the mtime nor the ctime is less than
//! [`FRESHNESS_WINDOW`] (2 s) old at the time of the call. While the file is that young it is
//! read again on every call, because a filesystem with coarse timestamps (or a rewrite within one
//! clock tick) can hide a same-size in-place rewrite behind an unchanged stamp; after 2 s any
//! later write necessarily changes the mtime. A re-read whose bytes hash to the cached SHA-256 is
//! not parsed again. The stamp is taken from the descriptor that is then read, so an atomic
//! replacement (rename) is always seen as one consistent file, and a stamp can only ever be
//! associated with content at least as new as itself.
//!
//! A missing, unreadable or invalid file is an error naming the problem; the cache is dropped, so
//! nothing stale survives a broken file, and the next call tries again.

use std::fs;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use toolgate_canon::Sha256Digest;

/// While the file's mtime or ctime is younger than this, it is re-read on every call.
pub const FRESHNESS_WINDOW: Duration = Duration::from_secs(2);

/// Why a watched file could not be loaded.
#[derive(Debug)]
pub(crate) enum WatchError {
    /// It could not be opened or read.
    Unreadable(std::io::Error),
    /// It was read but is not a valid document: what is wrong.
    Invalid(String),
}

/// A file parsed by `parse` (its bytes and their digest), re-read as described above.
pub(crate) struct WatchedFile<T> {
    path: PathBuf,
    max_bytes: u64,
    parse: fn(&[u8], Sha256Digest) -> Result<T, String>,
    cache: Mutex<Option<Cached<T>>>,
    #[cfg(test)]
    pub(crate) counters: Arc<test_counters::Counters>,
}

impl<T> std::fmt::Debug for WatchedFile<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WatchedFile")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

struct Cached<T> {
    stamp: Stamp,
    digest: Sha256Digest,
    parsed: Arc<T>,
}

/// What identifies one version of the file without reading it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stamp {
    pub(crate) dev: u64,
    pub(crate) ino: u64,
    pub(crate) size: u64,
    pub(crate) mtime: Option<SystemTime>,
    pub(crate) ctime: Option<SystemTime>,
}

impl Stamp {
    fn of(meta: &fs::Metadata) -> Self {
        #[cfg(unix)]
        {
            use std::os::unix::fs::MetadataExt as _;
            let ctime = u32::try_from(meta.ctime_nsec()).ok().and_then(|nanos| {
                let secs = u64::try_from(meta.ctime()).ok()?;
                SystemTime::UNIX_EPOCH.checked_add(Duration::new(secs, nanos))
            });
            Stamp {
                dev: meta.dev(),
                ino: meta.ino(),
                size: meta.len(),
                mtime: meta.modified().ok(),
                ctime,
            }
        }
        #[cfg(not(unix))]
        {
            Stamp {
                dev: 0,
                ino: 0,
                size: meta.len(),
                mtime: meta.modified().ok(),
                ctime: None,
            }
        }
    }

    /// Whether the file may still be rewritten without changing this stamp: its mtime or ctime
    /// is younger than [`FRESHNESS_WINDOW`], in the future, or unknown (before the epoch or not
    /// provided by the platform: then always re-read).
    pub(crate) fn is_fresh(&self, now: SystemTime) -> bool {
        let young = |t: Option<SystemTime>| match t {
            None => true,
            Some(t) => now
                .duration_since(t)
                .map_or(true, |age| age < FRESHNESS_WINDOW),
        };
        young(self.mtime) || (cfg!(unix) && young(self.ctime))
    }
}

impl<T> WatchedFile<T> {
    /// The file at `path`, at most `max_bytes`, parsed by `parse`. Touches nothing on disk.
    pub(crate) fn new(
        path: PathBuf,
        max_bytes: u64,
        parse: fn(&[u8], Sha256Digest) -> Result<T, String>,
    ) -> Self {
        WatchedFile {
            path,
            max_bytes,
            parse,
            cache: Mutex::new(None),
            #[cfg(test)]
            counters: Arc::default(),
        }
    }

    /// The file's path.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// The file as of `now` (the clock of the freshness rule; injectable for tests).
    pub(crate) fn load(&self, now: SystemTime) -> Result<Arc<T>, WatchError> {
        // A poisoned lock only means another thread panicked while holding it. The cache is only
        // ever replaced by whole assignments, so it is a valid (possibly empty) cache either way.
        let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        let result = self.load_locked(&mut cache, now);
        if result.is_err() {
            *cache = None;
        }
        result
    }

    fn load_locked(
        &self,
        cache: &mut Option<Cached<T>>,
        now: SystemTime,
    ) -> Result<Arc<T>, WatchError> {
        // A regular file only, opened without blocking (a FIFO here must not freeze the caller);
        // the operator chose the path, so a link to a regular file is followed.
        let file =
            toolgate_storage::open_regular_read(&self.path, toolgate_storage::Symlinks::Follow)
                .map_err(|e| match toolgate_storage::FileProblem::of(&e) {
                    Some(problem) => WatchError::Invalid(problem.to_string()),
                    None => WatchError::Unreadable(e),
                })?;
        let meta = file.metadata().map_err(WatchError::Unreadable)?;
        let stamp = Stamp::of(&meta);
        if let Some(cached) = cache.as_ref()
            && cached.stamp == stamp
            && !stamp.is_fresh(now)
        {
            return Ok(Arc::clone(&cached.parsed));
        }
        let mut bytes = Vec::new();
        file.take(self.max_bytes + 1)
            .read_to_end(&mut bytes)
            .map_err(WatchError::Unreadable)?;
        #[cfg(test)]
        self.counters.read();
        if bytes.len() as u64 > self.max_bytes {
            return Err(WatchError::Invalid(format!(
                "it is larger than {} bytes",
                self.max_bytes
            )));
        }
        let digest = Sha256Digest::of(&bytes);
        let parsed = match cache.as_ref() {
            Some(cached) if cached.digest == digest => Arc::clone(&cached.parsed),
            _ => {
                #[cfg(test)]
                self.counters.parse();
                Arc::new((self.parse)(&bytes, digest).map_err(WatchError::Invalid)?)
            }
        };
        *cache = Some(Cached {
            stamp,
            digest,
            parsed: Arc::clone(&parsed),
        });
        Ok(parsed)
    }
}

#[cfg(test)]
pub(crate) mod test_counters {
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// How often the file was read and parsed (for the caching tests).
    #[derive(Debug, Default)]
    pub(crate) struct Counters {
        reads: AtomicUsize,
        parses: AtomicUsize,
    }

    impl Counters {
        pub(crate) fn read(&self) {
            self.reads.fetch_add(1, Ordering::SeqCst);
        }
        pub(crate) fn parse(&self) {
            self.parses.fetch_add(1, Ordering::SeqCst);
        }
        pub(crate) fn get(&self) -> (usize, usize) {
            (
                self.reads.load(Ordering::SeqCst),
                self.parses.load(Ordering::SeqCst),
            )
        }
    }
}
