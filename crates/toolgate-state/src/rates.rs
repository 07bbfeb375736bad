//! Token-bucket rate limits, checked atomically across several buckets per call.
//!
//! Each key (for example `"principal:alice"` and `"tool:alice:write_note"`; the caller chooses
//! the keys) has a bucket holding up to `burst` tokens. A new bucket starts full. Tokens refill
//! continuously at `per_minute / 60` per second, up to `burst`. A call takes one token from every
//! bucket it lists, or from none: if any listed bucket is short, nothing is consumed and the
//! caller learns how long to wait.
//!
//! Arithmetic is exact: a token is 60·10⁹ units and a bucket gains `per_minute` units per
//! nanosecond, so there is no floating-point drift and `retry_after` is exact to the nanosecond
//! (rounded up).
//!
//! # Memory
//!
//! A bucket that has refilled to `burst` is indistinguishable from a bucket that was never used,
//! so it is dropped. Such full (and therefore idle) buckets are swept at most once per
//! [`SWEEP_INTERVAL`] of the clock passed to [`RateLimiter::check`], or earlier when the number of
//! buckets has doubled since the last sweep (and is at least [`SWEEP_MIN_BUCKETS`]). The limiter
//! therefore holds at most the buckets that were used within their refill time
//! (`burst / per_minute` minutes) plus those created since the last sweep. Buckets with
//! `per_minute == 0` never refill and are never dropped once used.
//!
//! # Shared by replicas
//!
//! `toolgate_postgres::PgRates` keeps the buckets in the database every replica uses: one row per key, taken under the rows' locks in one transaction
//! by the same arithmetic (`take`), timed by the database's clock, so a limit of N per minute
//! admits N calls across all replicas together.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Units per token: one minute in nanoseconds, so that `per_minute` is the refill in units per ns.
pub const UNITS_PER_TOKEN: u128 = 60_000_000_000;
/// Full buckets are dropped at most this often (in the injected clock's time)...
pub const SWEEP_INTERVAL: Duration = Duration::from_secs(60);
/// ...or when the bucket count has doubled since the last sweep and is at least this.
pub const SWEEP_MIN_BUCKETS: usize = 1024;

/// The limit of one bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Limit {
    /// Capacity: how many calls may happen back to back after an idle period. `0` refuses
    /// every call.
    pub burst: u32,
    /// Sustained rate: tokens added per minute (continuously). `0` means the burst never refills.
    pub per_minute: u32,
}

/// A call refused because a bucket is empty. Nothing was consumed from any bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limited {
    /// Index into the `keys` passed to [`RateLimiter::check`] of the bucket that is short. If
    /// several are, the one with the longest wait (the first listed on a tie).
    pub key_index: usize,
    /// How long until that bucket holds the tokens the call needs (assuming nobody else takes
    /// any). `Duration::MAX` if it never will (`burst` 0, `per_minute` 0, or a key listed more
    /// often than its `burst`).
    pub retry_after: Duration,
}

impl Limited {
    /// [`Limited::retry_after`] rounded up to whole seconds, at least 1 (for a `Retry-After`
    /// style hint); `u64::MAX` when it never refills.
    pub fn retry_after_secs(&self) -> u64 {
        let secs = self.retry_after.as_secs();
        let rounded = if self.retry_after.subsec_nanos() > 0 {
            secs.saturating_add(1)
        } else {
            secs
        };
        rounded.max(1)
    }
}

impl fmt::Display for Limited {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.retry_after == Duration::MAX {
            write!(
                f,
                "rate_limited: rate limit {} of this call allows no further calls; nothing was \
                 consumed; ask the operator to raise the limit",
                self.key_index
            )
        } else {
            write!(
                f,
                "rate_limited: rate limit {} of this call is exhausted; nothing was consumed; \
                 retry after {} s",
                self.key_index,
                self.retry_after_secs()
            )
        }
    }
}

impl std::error::Error for Limited {}

/// One key's bucket. Its times are nanoseconds on the clock of whoever keeps it (the limiter's
/// monotonic clock in memory, the database's clock in PostgreSQL).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bucket {
    /// Tokens × [`UNITS_PER_TOKEN`], at most `limit.burst` tokens.
    pub units: u128,
    /// When `units` was last brought up to date.
    pub at: u64,
    /// The limit it was last brought up to date with.
    pub limit: Limit,
}

impl Bucket {
    /// A bucket holding `limit.burst` tokens at `now`.
    pub fn full(limit: Limit, now: u64) -> Self {
        Bucket {
            units: capacity(limit),
            at: now,
            limit,
        }
    }

    /// Refills up to `now` at the old rate, then applies `limit` (clamping to its burst).
    fn advance(&mut self, now: u64, limit: Limit) {
        self.refill(now);
        self.limit = limit;
        self.units = self.units.min(capacity(limit));
    }

    fn refill(&mut self, now: u64) {
        // A caller may pass a time taken before another thread's (or another replica's); time
        // never runs backwards for a bucket.
        let elapsed = u128::from(now.saturating_sub(self.at));
        if now > self.at {
            self.at = now;
        }
        let gained = elapsed.saturating_mul(u128::from(self.limit.per_minute));
        self.units = self.units.saturating_add(gained).min(capacity(self.limit));
    }

    fn is_full(&self) -> bool {
        self.units >= capacity(self.limit)
    }

    /// How long until `tokens` tokens are available, `None` if they already are.
    fn wait_for(&self, tokens: u32) -> Option<Duration> {
        let need = u128::from(tokens) * UNITS_PER_TOKEN;
        if self.units >= need {
            return None;
        }
        if tokens > self.limit.burst || self.limit.per_minute == 0 {
            return Some(Duration::MAX);
        }
        let deficit = need - self.units;
        let nanos = deficit.div_ceil(u128::from(self.limit.per_minute));
        Some(u64::try_from(nanos).map_or(Duration::MAX, Duration::from_nanos))
    }
}

fn capacity(limit: Limit) -> u128 {
    u128::from(limit.burst) * UNITS_PER_TOKEN
}

/// Takes one token per listing from the buckets of `keys` at `now`, or none: the one arithmetic
/// of every place buckets are kept. A key without a bucket in `buckets` gets a full one; every
/// listed bucket is brought up to `now` (and to its listed limit) either way.
pub fn take(
    buckets: &mut HashMap<String, Bucket>,
    keys: &[(String, Limit)],
    now: u64,
) -> Result<(), Limited> {
    // Bring every bucket up to date and count how many tokens each distinct key needs.
    let mut needs: HashMap<&str, (usize, u32)> = HashMap::with_capacity(keys.len());
    for (index, (key, limit)) in keys.iter().enumerate() {
        // Look up by &str first so that the common case (existing bucket) allocates nothing.
        match buckets.get_mut(key.as_str()) {
            Some(bucket) => bucket.advance(now, *limit),
            None => {
                buckets.insert(key.clone(), Bucket::full(*limit, now));
            }
        }
        let need = needs.entry(key.as_str()).or_insert((index, 0));
        need.1 = need.1.saturating_add(1);
    }

    // Refuse if any bucket is short, reporting the longest wait.
    let mut worst: Option<Limited> = None;
    for (key, &(key_index, tokens)) in &needs {
        let Some(bucket) = buckets.get(*key) else {
            continue; // inserted above; unreachable
        };
        if let Some(retry_after) = bucket.wait_for(tokens) {
            let candidate = Limited {
                key_index,
                retry_after,
            };
            worst = Some(match worst {
                Some(w)
                    if (w.retry_after, std::cmp::Reverse(w.key_index))
                        >= (retry_after, std::cmp::Reverse(key_index)) =>
                {
                    w
                }
                _ => candidate,
            });
        }
    }
    if let Some(limited) = worst {
        return Err(limited);
    }

    for (key, &(_, tokens)) in &needs {
        if let Some(bucket) = buckets.get_mut(*key) {
            bucket.units -= u128::from(tokens) * UNITS_PER_TOKEN;
        }
    }
    Ok(())
}

#[derive(Debug)]
struct State {
    buckets: HashMap<String, Bucket>,
    last_sweep: Option<u64>,
    sweep_at_len: usize,
}

impl State {
    fn maybe_sweep(&mut self, now: u64) {
        let due_by_time = match self.last_sweep {
            None => {
                self.last_sweep = Some(now);
                false
            }
            Some(last) => u128::from(now.saturating_sub(last)) >= SWEEP_INTERVAL.as_nanos(),
        };
        if due_by_time || self.buckets.len() >= self.sweep_at_len {
            self.buckets.retain(|_, bucket| {
                bucket.refill(now);
                !bucket.is_full()
            });
            self.last_sweep = Some(now);
            self.sweep_at_len = self.buckets.len().saturating_mul(2).max(SWEEP_MIN_BUCKETS);
        }
    }
}

/// Token buckets keyed by caller-chosen strings. Thread-safe; one mutex held for the whole check.
#[derive(Debug)]
pub struct RateLimiter {
    /// The instant the limiter's clock counts from (an earlier instant counts as this one).
    origin: Instant,
    state: Mutex<State>,
}

impl Default for RateLimiter {
    fn default() -> Self {
        Self::new()
    }
}

impl RateLimiter {
    /// An empty limiter (every bucket starts full on first use).
    pub fn new() -> Self {
        RateLimiter {
            origin: Instant::now(),
            state: Mutex::new(State {
                buckets: HashMap::new(),
                last_sweep: None,
                sweep_at_len: SWEEP_MIN_BUCKETS,
            }),
        }
    }

    /// Takes one token from every bucket in `keys` at time `now`, or none.
    ///
    /// Each key's bucket is created full with its limit on first use. If the limit given for an
    /// existing key differs from the stored one (a policy reload), the new limit applies from this
    /// check on: the bucket is refilled at the old rate up to `now`, then clamped to the new burst.
    /// A key listed twice needs two tokens (and its last listed limit applies).
    pub fn check(&self, keys: &[(String, Limit)], now: Instant) -> Result<(), Limited> {
        let now = u64::try_from(now.saturating_duration_since(self.origin).as_nanos())
            .unwrap_or(u64::MAX);
        // A poisoned lock means another thread panicked mid-check; every bucket is still a valid
        // bucket (fields are only assigned whole), at worst with one token more or less.
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.maybe_sweep(now);
        take(&mut state.buckets, keys, now)
    }

    /// How many buckets are held (for monitoring and tests).
    pub fn len(&self) -> usize {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .buckets
            .len()
    }

    /// Whether no bucket is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Where token buckets are kept: this process's memory ([`RateLimiter`]) or the database every
/// replica shares (`toolgate_postgres::PgRates`).
/// `crates/toolgate-postgres/tests/rate_conformance.rs` runs the same cases against every store.
///
/// What every store guarantees: `take` takes one token from the bucket of every key listed, or
/// none (all or nothing, atomically with respect to every other taker of the same store); a
/// bucket starts full with its limit on first use and refills at its rate; a refusal names the
/// first key whose bucket is empty and how long until it has a token. `Err` means the buckets
/// cannot be reached; the check then refuses the call (fail closed).
pub trait RateStore: Send + Sync + std::fmt::Debug {
    /// Takes the tokens of `keys` now, or none.
    fn take(&self, keys: &[(String, Limit)]) -> Result<Result<(), Limited>, String>;
}

impl RateStore for RateLimiter {
    fn take(&self, keys: &[(String, Limit)]) -> Result<Result<(), Limited>, String> {
        Ok(self.check(keys, Instant::now()))
    }
}

/// The name of the buckets' file in its directory.
pub const RATES_FILE_NAME: &str = "rates.json";
/// The name of the lock file every process taking from the buckets holds while it does.
pub const RATES_LOCK_NAME: &str = "rates.lock";
/// A buckets file larger than this is refused as invalid.
pub const MAX_RATES_FILE_BYTES: u64 = 16 * 1024 * 1024;

/// Token buckets in a file shared by every process on one directory (a ledger): each take holds
/// `<dir>/rates.lock` (an advisory `flock`), reads `<dir>/rates.json`, takes by the one
/// arithmetic ([`take`]) timed by the wall clock (nanoseconds since the epoch; a clock that steps
/// back refills nothing), drops the buckets that are full again, and replaces the file atomically
/// and durably (a temporary file, fsync, rename, fsync of the directory) before it answers. So a
/// limit of N per minute admits N calls across all those processes together, and a crash never
/// hands back tokens that were taken.
///
/// It costs a durable write per call that has a limit: the gate's default is the process's
/// [`RateLimiter`], and replicas on several machines share a database's buckets instead.
/// A file that cannot be read or parsed refuses every call (fail closed), naming the file and
/// the fix. Format: `{"version":1,"buckets":{KEY:{"at_ns":N,"burst":N,"per_minute":N,
/// "units":"DECIMAL"}}}` (units as a string: they exceed JSON's exact integers).
#[derive(Debug)]
pub struct FileRates {
    dir: std::path::PathBuf,
    storage: std::sync::Arc<dyn toolgate_storage::Storage>,
    /// Opened on first use; threads of this process take turns on it.
    lock: Mutex<Option<toolgate_storage::LockFile>>,
}

impl FileRates {
    /// The buckets of `dir` (created on first use), on the filesystem.
    pub fn new(dir: impl Into<std::path::PathBuf>) -> Self {
        FileRates {
            dir: dir.into(),
            storage: std::sync::Arc::new(toolgate_storage::FsStorage),
            lock: Mutex::new(None),
        }
    }

    /// Writes through `storage` (fault injection in tests) instead of the filesystem.
    pub fn with_storage(mut self, storage: std::sync::Arc<dyn toolgate_storage::Storage>) -> Self {
        self.storage = storage;
        self
    }

    /// The buckets' file.
    pub fn path(&self) -> std::path::PathBuf {
        self.dir.join(RATES_FILE_NAME)
    }

    fn take_locked(
        &self,
        keys: &[(String, Limit)],
        now: u64,
    ) -> Result<Result<(), Limited>, String> {
        let path = self.path();
        let mut buckets = match toolgate_storage::read_regular(
            &path,
            MAX_RATES_FILE_BYTES,
            toolgate_storage::Symlinks::Refuse,
        ) {
            Ok(None) => HashMap::new(),
            Ok(Some(bytes)) => parse_buckets(&bytes).map_err(|problem| {
                format!(
                    "the rate buckets file {} is invalid: {problem}; remove it to start every bucket full (every call with a limit is refused until then)",
                    path.display()
                )
            })?,
            Err(error) => {
                return Err(format!(
                    "the rate buckets file {} cannot be read: {error}; make it a readable regular file or remove it",
                    path.display()
                ));
            }
        };
        let taken = take(&mut buckets, keys, now);
        for bucket in buckets.values_mut() {
            bucket.refill(now);
        }
        buckets.retain(|_, bucket| !bucket.is_full());
        toolgate_storage::replace_file(
            &*self.storage,
            &self.dir,
            RATES_FILE_NAME,
            &buckets_bytes(&buckets),
        )
        .map_err(|error| format!("the rate buckets cannot be written: {error}"))?;
        Ok(taken)
    }
}

impl RateStore for FileRates {
    fn take(&self, keys: &[(String, Limit)]) -> Result<Result<(), Limited>, String> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
        // The file lock excludes other processes; this mutex, the threads of this one.
        let mut lock = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
        if lock.is_none() {
            toolgate_storage::create_dir_durably(&*self.storage, &self.dir).map_err(|error| {
                format!("the rate buckets' directory cannot be created: {error}")
            })?;
            *lock = Some(
                toolgate_storage::LockFile::open(self.dir.join(RATES_LOCK_NAME))
                    .map_err(|error| format!("the rate buckets' lock cannot be opened: {error}"))?,
            );
        }
        let Some(file) = lock.as_ref() else {
            return Err("the rate buckets' lock is not open".to_owned());
        };
        let _held = file
            .lock()
            .map_err(|error| format!("the rate buckets' lock cannot be taken: {error}"))?;
        self.take_locked(keys, now)
    }
}

/// The buckets of a file's bytes.
fn parse_buckets(bytes: &[u8]) -> Result<HashMap<String, Bucket>, String> {
    let document: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|e| format!("not JSON ({e})"))?;
    if document.get("version").and_then(serde_json::Value::as_u64) != Some(1) {
        return Err("\"version\" is not 1".to_owned());
    }
    let Some(serde_json::Value::Object(entries)) = document.get("buckets") else {
        return Err("\"buckets\" is not an object".to_owned());
    };
    let mut buckets = HashMap::with_capacity(entries.len());
    for (key, entry) in entries {
        let number = |name: &str| entry.get(name).and_then(serde_json::Value::as_u64);
        let small = |name: &str| number(name).and_then(|n| u32::try_from(n).ok());
        let bucket = (|| {
            Some(Bucket {
                units: entry.get("units")?.as_str()?.parse().ok()?,
                at: number("at_ns")?,
                limit: Limit {
                    burst: small("burst")?,
                    per_minute: small("per_minute")?,
                },
            })
        })()
        .ok_or_else(|| {
            format!("the bucket {key:?} is not {{\"at_ns\",\"burst\",\"per_minute\",\"units\"}}")
        })?;
        buckets.insert(key.clone(), bucket);
    }
    Ok(buckets)
}

/// The file's bytes of `buckets` (keys sorted).
fn buckets_bytes(buckets: &HashMap<String, Bucket>) -> Vec<u8> {
    let entries: serde_json::Map<String, serde_json::Value> = buckets
        .iter()
        .map(|(key, bucket)| {
            (
                key.clone(),
                serde_json::json!({
                    "at_ns": bucket.at,
                    "burst": bucket.limit.burst,
                    "per_minute": bucket.limit.per_minute,
                    "units": bucket.units.to_string(),
                }),
            )
        })
        .collect();
    let mut bytes = serde_json::to_vec(&serde_json::json!({"version": 1, "buckets": entries}))
        .unwrap_or_default();
    bytes.push(b'\n');
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: Duration = Duration::from_secs(1);

    fn key(name: &str, burst: u32, per_minute: u32) -> (String, Limit) {
        (name.to_owned(), Limit { burst, per_minute })
    }

    #[test]
    fn starts_full_then_limits_then_refills() {
        let rl = RateLimiter::new();
        let t0 = Instant::now();
        let keys = [key("a", 3, 60)];
        for _ in 0..3 {
            rl.check(&keys, t0).unwrap();
        }
        let limited = rl.check(&keys, t0).unwrap_err();
        assert_eq!(limited.key_index, 0);
        assert_eq!(limited.retry_after, SEC);
        assert_eq!(limited.retry_after_secs(), 1);
        // Half a token after 500 ms: still limited, 500 ms to go.
        let limited = rl.check(&keys, t0 + SEC / 2).unwrap_err();
        assert_eq!(limited.retry_after, SEC / 2);
        assert_eq!(limited.retry_after_secs(), 1);
        rl.check(&keys, t0 + SEC).unwrap();
        assert!(rl.check(&keys, t0 + SEC).is_err());
    }

    #[test]
    fn refill_is_capped_at_burst() {
        let rl = RateLimiter::new();
        let t0 = Instant::now();
        let keys = [key("a", 2, 600)];
        rl.check(&keys, t0).unwrap();
        rl.check(&keys, t0).unwrap();
        // An hour later there are 2 tokens, not 6000.
        let t1 = t0 + 3600 * SEC;
        rl.check(&keys, t1).unwrap();
        rl.check(&keys, t1).unwrap();
        assert!(rl.check(&keys, t1).is_err());
    }

    #[test]
    fn all_or_nothing_across_buckets() {
        let rl = RateLimiter::new();
        let t0 = Instant::now();
        let wide = key("principal", 10, 60);
        let narrow = key("tool", 1, 6);
        rl.check(&[wide.clone(), narrow.clone()], t0).unwrap();
        let limited = rl.check(&[wide.clone(), narrow.clone()], t0).unwrap_err();
        assert_eq!(limited.key_index, 1);
        assert_eq!(limited.retry_after, 10 * SEC);
        // The refused call took nothing from "principal": 9 tokens remain.
        for _ in 0..9 {
            rl.check(std::slice::from_ref(&wide), t0).unwrap();
        }
        assert_eq!(rl.check(&[wide], t0).unwrap_err().key_index, 0);
    }

    #[test]
    fn reports_the_longest_wait_and_rounds_up() {
        let rl = RateLimiter::new();
        let t0 = Instant::now();
        let keys = [key("fast", 1, 60), key("slow", 1, 7)];
        rl.check(&keys, t0).unwrap();
        let limited = rl.check(&keys, t0).unwrap_err();
        assert_eq!(limited.key_index, 1);
        // 60/7 s = 8.571428572 s (rounded up to the ns) -> 9 whole seconds.
        assert_eq!(limited.retry_after, Duration::from_nanos(8_571_428_572));
        assert_eq!(limited.retry_after_secs(), 9);
        assert!(limited.to_string().starts_with("rate_limited: "));
        assert!(limited.to_string().contains("retry after 9 s"));
    }

    #[test]
    fn limit_change_applies_at_next_check_and_clamps() {
        let rl = RateLimiter::new();
        let t0 = Instant::now();
        for _ in 0..2 {
            rl.check(&[key("a", 10, 60)], t0).unwrap();
        }
        // 8 tokens left; the reload lowers burst to 3.
        for _ in 0..3 {
            rl.check(&[key("a", 3, 60)], t0).unwrap();
        }
        assert!(rl.check(&[key("a", 3, 60)], t0).is_err());
        // Raising the burst does not add tokens, but refill now runs at the new rate.
        let limited = rl.check(&[key("a", 100, 600)], t0).unwrap_err();
        assert_eq!(limited.retry_after, SEC / 10);
        rl.check(&[key("a", 100, 600)], t0 + SEC / 10).unwrap();
    }

    #[test]
    fn zero_limits_never_allow_or_never_refill() {
        let rl = RateLimiter::new();
        let t0 = Instant::now();
        let limited = rl.check(&[key("off", 0, 60)], t0).unwrap_err();
        assert_eq!(limited.retry_after, Duration::MAX);
        assert_eq!(limited.retry_after_secs(), u64::MAX);
        assert!(limited.to_string().contains("no further calls"));

        rl.check(&[key("once", 1, 0)], t0).unwrap();
        let limited = rl.check(&[key("once", 1, 0)], t0 + 3600 * SEC).unwrap_err();
        assert_eq!(limited.retry_after, Duration::MAX);
    }

    #[test]
    fn a_key_listed_twice_takes_two_tokens() {
        let rl = RateLimiter::new();
        let t0 = Instant::now();
        let twice = [key("a", 3, 60), key("a", 3, 60)];
        rl.check(&twice, t0).unwrap();
        let limited = rl.check(&twice, t0).unwrap_err();
        assert_eq!(limited.key_index, 0);
        assert_eq!(limited.retry_after, SEC);
        rl.check(&twice[..1], t0).unwrap();
        // More than the burst can ever hold.
        let thrice = [key("b", 2, 60), key("b", 2, 60), key("b", 2, 60)];
        assert_eq!(
            rl.check(&thrice, t0).unwrap_err().retry_after,
            Duration::MAX
        );
    }

    #[test]
    fn earlier_instant_does_not_refill_or_panic() {
        let rl = RateLimiter::new();
        let t0 = Instant::now() + 10 * SEC;
        rl.check(&[key("a", 1, 60)], t0).unwrap();
        let earlier = t0 - 5 * SEC;
        assert!(rl.check(&[key("a", 1, 60)], earlier).is_err());
        rl.check(&[key("a", 1, 60)], t0 + SEC).unwrap();
    }

    #[test]
    fn empty_key_list_always_passes() {
        let rl = RateLimiter::new();
        rl.check(&[], Instant::now()).unwrap();
        assert!(rl.is_empty());
    }

    #[test]
    fn full_idle_buckets_are_evicted() {
        let rl = RateLimiter::new();
        let t0 = Instant::now();
        for i in 0..100 {
            rl.check(&[key(&format!("k{i}"), 5, 60)], t0).unwrap();
        }
        // One key keeps being used, with a slow refill.
        rl.check(&[key("busy", 5, 1)], t0).unwrap();
        assert_eq!(rl.len(), 101);
        // After the sweep interval the 100 others have refilled (1 token at 1/s) and go.
        rl.check(&[key("busy", 5, 1)], t0 + SWEEP_INTERVAL).unwrap();
        assert_eq!(rl.len(), 1);
        // The evicted keys behave like new (full) buckets.
        for _ in 0..5 {
            rl.check(&[key("k0", 5, 60)], t0 + SWEEP_INTERVAL).unwrap();
        }
        assert!(rl.check(&[key("k0", 5, 60)], t0 + SWEEP_INTERVAL).is_err());
    }

    #[test]
    fn sweep_by_growth_is_bounded() {
        let rl = RateLimiter::new();
        let t0 = Instant::now();
        // Many keys within one instant, each checked once and then refilled a second later.
        for i in 0..(3 * SWEEP_MIN_BUCKETS) {
            let t = t0 + SEC * u32::try_from(i / SWEEP_MIN_BUCKETS).unwrap() * 2;
            rl.check(&[key(&format!("k{i}"), 1, 60)], t).unwrap();
        }
        // Without eviction there would be 3072 buckets; growth-triggered sweeps dropped the
        // refilled ones (each refills within 1 s).
        assert!(rl.len() <= 2 * SWEEP_MIN_BUCKETS, "{}", rl.len());
    }

    #[test]
    fn concurrent_checks_never_overspend() {
        let rl = std::sync::Arc::new(RateLimiter::new());
        let t0 = Instant::now();
        let handles: Vec<_> = (0..2)
            .map(|_| {
                let rl = std::sync::Arc::clone(&rl);
                std::thread::spawn(move || {
                    (0..500)
                        .filter(|_| rl.check(&[key("shared", 300, 1)], t0).is_ok())
                        .count()
                })
            })
            .collect();
        let granted: usize = handles.into_iter().map(|h| h.join().unwrap()).sum();
        assert_eq!(granted, 300);
    }
}
