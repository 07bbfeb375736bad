//! Durable begin+complete cycles per second, sequential and with 16 concurrent callers, for
//! idempotent effects (1 fdatasync per sequential cycle) and unsafe ones (2), next to this
//! machine's raw fsync rate measured in the same run (run: `cargo bench -p toolgate-commit --bench
//! effect`; set `EFFECT_BENCH_DIR` to measure another filesystem). Last, the sequential ratio to
//! one-fsync-per-commit measured in interleaved pairs (one of each, alternately), which stays
//! meaningful when the disk's fsync rate drifts during the run.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::fs::{File, OpenOptions};
use std::io::{self, Seek as _, SeekFrom, Write as _};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::json;
use toolgate_canon::Sha256Digest;
use toolgate_commit::{
    Begin, EffectConfig, EffectKind, EffectRequest, EffectStore, FaultyStorage, FsStorage, Op,
    Scope, Storage,
};

const RAW_FSYNCS: u32 = 200;
const SEQUENTIAL: usize = 200;
const THREADS: usize = 16;
const PER_THREAD: usize = 40;

fn raw_fsync_rate(dir: &Path) -> f64 {
    let path = dir.join("raw-fsync");
    let mut file = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(&path)
        .unwrap();
    let start = Instant::now();
    for i in 0..RAW_FSYNCS {
        file.seek(SeekFrom::Start(0)).unwrap();
        file.write_all(format!("{i:08}").as_bytes()).unwrap();
        file.sync_data().unwrap();
    }
    f64::from(RAW_FSYNCS) / start.elapsed().as_secs_f64()
}

/// The rate of a store that makes each commit durable with exactly one fsync: a commit record of
/// `RECORD_BYTES` appended at the next offset of a preallocated (zero-filled, synced) file, then
/// `fdatasync`. This is the "one fsync per commit" the goal is stated against; the 8-byte
/// overwrite of [`raw_fsync_rate`] is the device's best case, reported next to it.
fn one_fsync_per_commit_rate(dir: &Path) -> f64 {
    const RECORD_BYTES: usize = 400;
    let path = dir.join("one-fsync-per-commit");
    let mut file = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(&path)
        .unwrap();
    let total = RECORD_BYTES * RAW_FSYNCS as usize;
    file.write_all(&vec![0u8; total + 4096]).unwrap();
    file.sync_all().unwrap();
    file.seek(SeekFrom::Start(0)).unwrap();
    let record = vec![b'r'; RECORD_BYTES];
    let start = Instant::now();
    for _ in 0..RAW_FSYNCS {
        file.write_all(&record).unwrap();
        file.sync_data().unwrap();
    }
    f64::from(RAW_FSYNCS) / start.elapsed().as_secs_f64()
}

fn cycle(store: &EffectStore, kind: EffectKind, key: String) {
    let req = EffectRequest {
        scope: Scope {
            principal: "bench".into(),
            tool: "bench".into(),
        },
        key,
        fingerprint: Sha256Digest::of(b"args"),
    };
    match store.begin(&req, kind).unwrap() {
        Begin::Execute(ticket) => store.complete(ticket, &json!({"ok": true})).unwrap(),
        other => panic!("expected Execute, got {other:?}"),
    }
}

fn fsyncs(storage: &FaultyStorage) -> u64 {
    storage.calls(Op::FsyncFile) + storage.calls(Op::FsyncDir)
}

/// A store in `dir` on counting storage (no fault armed), so the run reports fsyncs per cycle.
fn counted_store(dir: &Path) -> (Arc<EffectStore>, Arc<FaultyStorage>) {
    counted_store_on(dir, Arc::new(FsStorage))
}

fn counted_store_on(dir: &Path, inner: Arc<dyn Storage>) -> (Arc<EffectStore>, Arc<FaultyStorage>) {
    let storage = Arc::new(FaultyStorage::new(inner));
    let store =
        Arc::new(EffectStore::open_with_storage(EffectConfig::new(dir), storage.clone()).unwrap());
    (store, storage)
}

/// (cycles per second, fsyncs per cycle) of `SEQUENTIAL` cycles one after the other.
fn sequential(dir: &Path, kind: EffectKind, inner: Arc<dyn Storage>) -> (f64, f64) {
    let (store, storage) = counted_store_on(dir, inner);
    let before = fsyncs(&storage);
    let start = Instant::now();
    for i in 0..SEQUENTIAL {
        cycle(&store, kind, format!("seq-{i}"));
    }
    let rate = SEQUENTIAL as f64 / start.elapsed().as_secs_f64();
    (rate, (fsyncs(&storage) - before) as f64 / SEQUENTIAL as f64)
}

/// (cycles per second, fsyncs per cycle) of `THREADS` callers doing `PER_THREAD` cycles each.
fn concurrent(dir: &Path, kind: EffectKind, inner: Arc<dyn Storage>) -> (f64, f64) {
    let (store, storage) = counted_store_on(dir, inner);
    let before = fsyncs(&storage);
    let barrier = Arc::new(Barrier::new(THREADS + 1));
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let (store, barrier) = (Arc::clone(&store), Arc::clone(&barrier));
            thread::spawn(move || {
                barrier.wait();
                for i in 0..PER_THREAD {
                    cycle(&store, kind, format!("conc-{t}-{i}"));
                }
            })
        })
        .collect();
    barrier.wait();
    let start = Instant::now();
    for h in handles {
        h.join().unwrap();
    }
    let total = THREADS * PER_THREAD;
    let rate = total as f64 / start.elapsed().as_secs_f64();
    (rate, (fsyncs(&storage) - before) as f64 / total as f64)
}

/// Pairs in the interleaved comparison.
const PAIRS: usize = 400;

/// The sequential rate of `kind` as a fraction of one-fsync-per-commit, measured pair by pair: one
/// one-fsync commit, then one store cycle, `PAIRS` times, each side's time summed. The disk's
/// fsync rate drifts by several times within seconds on a shared virtual disk; alternating single
/// operations exposes both sides to the same drift, so the ratio (of the summed times, which is
/// the ratio of the two throughputs) stays meaningful. Also returns the ratio over each tenth of
/// the run, sorted, to show its spread.
fn interleaved_ratio(dir: &Path, kind: EffectKind) -> (f64, Vec<f64>) {
    const RECORD_BYTES: usize = 400;
    std::fs::create_dir_all(dir).unwrap();
    let mut file = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(dir.join("one-fsync-per-commit"))
        .unwrap();
    file.write_all(&vec![0u8; RECORD_BYTES * PAIRS + 4096])
        .unwrap();
    file.sync_all().unwrap();
    file.seek(SeekFrom::Start(0)).unwrap();
    let record = vec![b'r'; RECORD_BYTES];
    let (store, _storage) = counted_store(&dir.join("store"));
    let (mut one, mut ours) = (Vec::with_capacity(PAIRS), Vec::with_capacity(PAIRS));
    for i in 0..PAIRS {
        let start = Instant::now();
        file.write_all(&record).unwrap();
        file.sync_data().unwrap();
        one.push(start.elapsed().as_secs_f64());
        let start = Instant::now();
        cycle(&store, kind, format!("pair-{i}"));
        ours.push(start.elapsed().as_secs_f64());
    }
    let ratio = |a: &[f64], b: &[f64]| a.iter().sum::<f64>() / b.iter().sum::<f64>();
    let tenth = PAIRS / 10;
    let mut tenths: Vec<f64> = (0..10)
        .map(|t| {
            let r = t * tenth..(t + 1) * tenth;
            ratio(&one[r.clone()], &ours[r])
        })
        .collect();
    tenths.sort_by(f64::total_cmp);
    (ratio(&one, &ours), tenths)
}

fn main() {
    let base = std::env::var_os("EFFECT_BENCH_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::env::current_dir().unwrap());
    let tmp = tempfile::tempdir_in(&base).unwrap();
    let raw = raw_fsync_rate(tmp.path());
    println!("raw fsync (write + fdatasync, {RAW_FSYNCS}x): {raw:>9.0} /s");
    let one = one_fsync_per_commit_rate(tmp.path());
    println!(
        "one fsync per commit (400-byte append + fdatasync, preallocated, {RAW_FSYNCS}x): {one:>9.0} /s"
    );
    for (name, kind) in [
        ("idempotent", EffectKind::Idempotent),
        ("unsafe", EffectKind::Unsafe),
    ] {
        let (seq_rate, seq_fsyncs) = sequential(
            &tmp.path().join(format!("seq-{name}")),
            kind,
            Arc::new(FsStorage),
        );
        let (conc_rate, conc_fsyncs) = concurrent(
            &tmp.path().join(format!("conc-{name}")),
            kind,
            Arc::new(FsStorage),
        );
        println!(
            "{name:<10} sequential begin+complete ({SEQUENTIAL} keys): {seq_rate:>9.0} /s  ({seq_fsyncs:.2} fsyncs per cycle, {:.2} of raw, {:.2} of one-fsync-per-commit)",
            seq_rate / raw,
            seq_rate / one
        );
        println!(
            "{name:<10} {THREADS} concurrent callers ({} keys):    {conc_rate:>9.0} /s  ({conc_fsyncs:.2} fsyncs per cycle, {:.2}x sequential)",
            THREADS * PER_THREAD,
            conc_rate / seq_rate
        );
    }
    for (name, kind) in [
        ("idempotent", EffectKind::Idempotent),
        ("unsafe", EffectKind::Unsafe),
    ] {
        let (ratio, tenths) = interleaved_ratio(&tmp.path().join(format!("pairs-{name}")), kind);
        println!(
            "{name:<10} sequential / one-fsync-per-commit, {PAIRS} interleaved pairs: {ratio:.2} (tenths of the run: {:.2} .. {:.2})",
            tenths[0],
            tenths[tenths.len() - 1]
        );
    }
    modelled_latencies();
}

/// The real filesystem whose `fdatasync` also takes `delay` (slept after the real one).
#[derive(Debug)]
struct Delayed {
    delay: Duration,
}

impl Storage for Delayed {
    fn read(&self, path: &Path, max_bytes: u64) -> io::Result<Option<Vec<u8>>> {
        FsStorage.read(path, max_bytes)
    }
    fn read_at(&self, file: &File, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        FsStorage.read_at(file, offset, len)
    }
    fn write_at(&self, file: &File, offset: u64, bytes: &[u8]) -> io::Result<()> {
        FsStorage.write_at(file, offset, bytes)
    }
    fn sync_data(&self, file: &File) -> io::Result<()> {
        FsStorage.sync_data(file)?;
        thread::sleep(self.delay);
        Ok(())
    }
    fn write_new(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        FsStorage.write_new(path, bytes)
    }
    fn fsync_file(&self, path: &Path) -> io::Result<()> {
        FsStorage.fsync_file(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        FsStorage.rename(from, to)
    }
    fn link(&self, from: &Path, to: &Path) -> io::Result<()> {
        FsStorage.link(from, to)
    }
    fn append(&self, file: &File, bytes: &[u8]) -> io::Result<()> {
        FsStorage.append(file, bytes)
    }
    fn fsync_dir(&self, dir: &Path) -> io::Result<()> {
        FsStorage.fsync_dir(dir)
    }
    fn remove(&self, path: &Path) -> io::Result<()> {
        FsStorage.remove(path)
    }
    fn list(&self, dir: &Path) -> io::Result<Vec<PathBuf>> {
        FsStorage.list(dir)
    }
}

/// The concurrent/sequential ratio as a function of the device's flush latency, which this shared
/// disk cannot hold still (its fsync rate swings between 300 and 6,000 per second): the store on
/// tmpfs (`/dev/shm`, where `fdatasync` costs nothing), each `fdatasync` followed by a sleep of
/// the modelled latency. A sleep of `d` takes somewhat longer than `d`; the measured mean per
/// `fdatasync` is reported. Skipped without `/dev/shm`.
fn modelled_latencies() {
    let shm = Path::new("/dev/shm");
    if !shm.is_dir() {
        println!("modelled fsync latency: skipped (no /dev/shm)");
        return;
    }
    for micros in [0u64, 100, 250, 1000] {
        let delay = Duration::from_micros(micros);
        let probe = tempfile::tempdir_in(shm).unwrap();
        let file = File::create(probe.path().join("probe")).unwrap();
        let start = Instant::now();
        for _ in 0..50 {
            Delayed { delay }.sync_data(&file).unwrap();
        }
        let per_sync = start.elapsed().as_secs_f64() / 50.0 * 1e6;
        for (name, kind) in [
            ("idempotent", EffectKind::Idempotent),
            ("unsafe", EffectKind::Unsafe),
        ] {
            let tmp = tempfile::tempdir_in(shm).unwrap();
            let (seq, _) = sequential(&tmp.path().join("seq"), kind, Arc::new(Delayed { delay }));
            let (conc, conc_fsyncs) =
                concurrent(&tmp.path().join("conc"), kind, Arc::new(Delayed { delay }));
            println!(
                "modelled fsync {micros:>4} us (measured {per_sync:>6.0} us) {name:<10} sequential {seq:>7.0} /s, {THREADS} concurrent {conc:>7.0} /s ({conc_fsyncs:.2} fsyncs per cycle): {:.2}x",
                conc / seq
            );
        }
    }
}
