//! Durable begin+complete cycles per second, sequential and with 16 concurrent callers, next to this
//! machine's raw fsync rate measured in the same run (run: `cargo bench -p toolgate-commit --bench
//! effect`; set `EFFECT_BENCH_DIR` to measure another filesystem).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::fs::OpenOptions;
use std::io::{Seek as _, SeekFrom, Write as _};
use std::path::Path;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Instant;

use serde_json::json;
use toolgate_canon::Sha256Digest;
use toolgate_commit::effect::{
    Begin, EffectConfig, EffectKind, EffectRequest, EffectStore, FaultyStorage, FsStorage, Op,
    Scope,
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

fn cycle(store: &EffectStore, key: String) {
    let req = EffectRequest {
        scope: Scope {
            principal: "bench".into(),
            tool: "bench".into(),
        },
        key,
        fingerprint: Sha256Digest::of(b"args"),
    };
    match store.begin(&req, EffectKind::Unsafe).unwrap() {
        Begin::Execute(ticket) => store.complete(ticket, &json!({"ok": true})).unwrap(),
        other => panic!("expected Execute, got {other:?}"),
    }
}

fn fsyncs(storage: &FaultyStorage) -> u64 {
    storage.calls(Op::FsyncFile) + storage.calls(Op::FsyncDir)
}

fn main() {
    let base = std::env::var_os("EFFECT_BENCH_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::env::current_dir().unwrap());
    let tmp = tempfile::tempdir_in(&base).unwrap();
    let raw = raw_fsync_rate(tmp.path());

    // Counting storage (no fault armed) so the run reports fsyncs per commit.
    let storage = Arc::new(FaultyStorage::new(Arc::new(FsStorage)));
    let store = Arc::new(
        EffectStore::open_with_storage(EffectConfig::new(tmp.path().join("seq")), storage.clone())
            .unwrap(),
    );
    let before = fsyncs(&storage);
    let start = Instant::now();
    for i in 0..SEQUENTIAL {
        cycle(&store, format!("seq-{i}"));
    }
    let seq_rate = SEQUENTIAL as f64 / start.elapsed().as_secs_f64();
    let seq_fsyncs = (fsyncs(&storage) - before) as f64 / SEQUENTIAL as f64;

    let storage = Arc::new(FaultyStorage::new(Arc::new(FsStorage)));
    let store = Arc::new(
        EffectStore::open_with_storage(EffectConfig::new(tmp.path().join("conc")), storage.clone())
            .unwrap(),
    );
    let before = fsyncs(&storage);
    let barrier = Arc::new(Barrier::new(THREADS + 1));
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let (store, barrier) = (Arc::clone(&store), Arc::clone(&barrier));
            thread::spawn(move || {
                barrier.wait();
                for i in 0..PER_THREAD {
                    cycle(&store, format!("conc-{t}-{i}"));
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
    let conc_rate = total as f64 / start.elapsed().as_secs_f64();
    let conc_fsyncs = (fsyncs(&storage) - before) as f64 / total as f64;

    println!("raw fsync (write + fdatasync, {RAW_FSYNCS}x): {raw:>9.0} /s");
    println!(
        "sequential begin+complete ({SEQUENTIAL} keys):   {seq_rate:>9.0} /s  ({seq_fsyncs:.2} fsyncs per cycle, {:.2} of raw)",
        seq_rate / raw
    );
    println!(
        "16 concurrent callers ({total} keys):        {conc_rate:>9.0} /s  ({conc_fsyncs:.2} fsyncs per cycle, {:.2}x sequential)",
        conc_rate / seq_rate
    );
}
