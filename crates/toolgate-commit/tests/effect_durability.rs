//! Pipelined group commit: no answer about an unsafe effect is given before the journal lines it
//! rests on are durable; answers about idempotent effects rest on written lines, which
//! `EffectStore::sync` makes durable.
//!
//! A storage double models the page cache: an `fdatasync` makes durable exactly the bytes the
//! journal held when it started (what a power loss right after it would leave). Sixteen threads
//! run begin/complete cycles, and look at each other's keys, while batches are decided, written
//! and fdatasynced in overlap; the moment a call returns, the test checks that the lines its
//! answer depends on are in that durable image (unsafe) or in the journal (idempotent).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier, Mutex};
use std::thread;

use serde_json::{Value, json};
use toolgate_canon::Sha256Digest;
use toolgate_commit::{
    Begin, EffectConfig, EffectError, EffectKind, EffectRequest, EffectStore, FsStorage, Storage,
};

const THREADS: usize = 16;
const ROUNDS: usize = 25;

/// The real filesystem, plus the journal image the last completed `fdatasync` guarantees.
#[derive(Debug, Default)]
struct PageCache {
    inner: FsStorage,
    /// The longest image (in used bytes) any completed `fdatasync` of the journal started from.
    durable: Mutex<Vec<u8>>,
}

/// The used length of a journal image: its lines end at the first zero byte of the padding.
fn used(image: &[u8]) -> usize {
    image.iter().position(|&b| b == 0).unwrap_or(image.len())
}

impl PageCache {
    fn durable_contains(&self, needle: &str) -> bool {
        let image = self.durable.lock().unwrap();
        let text = String::from_utf8_lossy(&image[..used(&image)]).into_owned();
        text.contains(needle)
    }

    /// Whether the line is durable (`Unsafe`) or at least written to the journal (`Idempotent`).
    fn holds(&self, journal: &Path, kind: EffectKind, needle: &str) -> bool {
        match kind {
            EffectKind::Unsafe => self.durable_contains(needle),
            _ => String::from_utf8_lossy(&std::fs::read(journal).unwrap()).contains(needle),
        }
    }
}

impl Storage for PageCache {
    fn read(&self, path: &Path, max_bytes: u64) -> io::Result<Option<Vec<u8>>> {
        self.inner.read(path, max_bytes)
    }
    fn read_at(&self, file: &File, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        self.inner.read_at(file, offset, len)
    }
    fn write_at(&self, file: &File, offset: u64, bytes: &[u8]) -> io::Result<()> {
        self.inner.write_at(file, offset, bytes)
    }
    fn append(&self, file: &File, bytes: &[u8]) -> io::Result<()> {
        self.inner.append(file, bytes)
    }
    fn sync_data(&self, file: &File) -> io::Result<()> {
        // What the file holds now is what this fdatasync will have made durable.
        let len = usize::try_from(file.metadata()?.len()).unwrap();
        let image = self.inner.read_at(file, 0, len)?;
        self.inner.sync_data(file)?;
        let mut durable = self.durable.lock().unwrap();
        // fdatasyncs may overlap and end in any order; durability only accumulates.
        if used(&image) > used(&durable) {
            *durable = image;
        }
        Ok(())
    }
    fn write_new(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        self.inner.write_new(path, bytes)
    }
    fn fsync_file(&self, path: &Path) -> io::Result<()> {
        self.inner.fsync_file(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.inner.rename(from, to)
    }
    fn link(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.inner.link(from, to)
    }
    fn fsync_dir(&self, dir: &Path) -> io::Result<()> {
        self.inner.fsync_dir(dir)
    }
    fn remove(&self, path: &Path) -> io::Result<()> {
        self.inner.remove(path)
    }
    fn list(&self, dir: &Path) -> io::Result<Vec<PathBuf>> {
        self.inner.list(dir)
    }
}

fn req(key: &str) -> EffectRequest {
    EffectRequest {
        scope: toolgate_commit::Scope {
            principal: "alice".into(),
            tool: "writer".into(),
        },
        key: key.into(),
        // Unique per key, so its record's lines can be found in the journal image.
        fingerprint: Sha256Digest::of(key.as_bytes()),
    }
}

/// The canonical text of `key`'s result, as its completed line holds it.
fn result_of(key: &str) -> Value {
    json!({ "done": key })
}

fn result_text(key: &str) -> String {
    format!("{{\"done\":\"{key}\"}}")
}

/// Runs `key` through begin (and complete, if this call executes), checking after each answer
/// that what it rests on is durable. Returns the answer's name.
fn step(store: &EffectStore, storage: &PageCache, key: &str, kind: EffectKind) -> &'static str {
    let fingerprint = Sha256Digest::of(key.as_bytes()).to_hex();
    let journal = store.dir().join("effects.journal");
    match store.begin(&req(key), kind) {
        Ok(Begin::Execute(ticket)) => {
            if kind == EffectKind::Unsafe {
                assert!(
                    storage.durable_contains(&fingerprint),
                    "unsafe Execute for {key} before its in_progress line was durable"
                );
            }
            store.complete(ticket, &result_of(key)).unwrap();
            assert!(
                storage.holds(&journal, kind, &result_text(key)),
                "complete of {key} returned before its line was durable (or written)"
            );
            "execute"
        }
        Ok(Begin::Replay(value)) => {
            assert_eq!(value, result_of(key));
            assert!(
                storage.holds(&journal, kind, &result_text(key)),
                "replay of {key} rests on a line that is not durable (or written)"
            );
            "replay"
        }
        Err(EffectError::InProgress { .. }) => {
            assert!(
                storage.holds(&journal, kind, &fingerprint),
                "in-progress answer for {key} rests on a line that is not durable (or written)"
            );
            "in_progress"
        }
        other => panic!("unexpected answer for {key}: {other:?}"),
    }
}

fn run(kind: EffectKind) -> [usize; 3] {
    let dir = tempfile::tempdir().unwrap();
    let storage = Arc::new(PageCache::default());
    let store = Arc::new(
        EffectStore::open_with_storage(
            EffectConfig::new(dir.path()),
            Arc::clone(&storage) as Arc<dyn Storage>,
        )
        .unwrap(),
    );
    let barrier = Arc::new(Barrier::new(THREADS));
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let (store, storage, barrier) = (
                Arc::clone(&store),
                Arc::clone(&storage),
                Arc::clone(&barrier),
            );
            thread::spawn(move || {
                let mut tally = [0usize; 3];
                barrier.wait();
                for round in 0..ROUNDS {
                    // Its own key, then the neighbour's key of the same round: that one may be
                    // absent, in progress (written lazily if idempotent) or completed.
                    for owner in [t, (t + 1) % THREADS] {
                        let answer = step(&store, &storage, &format!("k-{owner}-{round}"), kind);
                        let slot = match answer {
                            "execute" => 0,
                            "replay" => 1,
                            _ => 2,
                        };
                        tally[slot] += 1;
                    }
                }
                tally
            })
        })
        .collect();
    let mut total = [0; 3];
    for handle in handles {
        let tally = handle.join().unwrap();
        for (sum, n) in total.iter_mut().zip(tally) {
            *sum += n;
        }
    }
    // What a clean shutdown does: afterwards every outcome is durable, whatever its kind.
    store.sync().unwrap();
    for t in 0..THREADS {
        for round in 0..ROUNDS {
            let key = format!("k-{t}-{round}");
            assert!(storage.durable_contains(&result_text(&key)), "{key}");
        }
    }
    total
}

#[test]
fn concurrent_unsafe_answers_rest_on_durable_lines() {
    let [executed, replayed, in_progress] = run(EffectKind::Unsafe);
    assert_eq!(executed, THREADS * ROUNDS, "one execution per key");
    assert_eq!(executed + replayed + in_progress, 2 * THREADS * ROUNDS);
}

#[test]
fn concurrent_idempotent_answers_rest_on_written_lines_and_sync_makes_them_durable() {
    let [executed, replayed, in_progress] = run(EffectKind::Idempotent);
    assert_eq!(executed, THREADS * ROUNDS, "one execution per key");
    assert_eq!(executed + replayed + in_progress, 2 * THREADS * ROUNDS);
}
