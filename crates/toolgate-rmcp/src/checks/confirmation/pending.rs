//! Pending two-step actions: a preview issues a one-time token, a later call confirms (or rejects)
//! it by repeating the preview's summary.
//!
//! By default pending actions live **in the memory of one process**. A confirmation must reach
//! the server process that issued the preview; after a restart, or on another replica, the token
//! is [`ConfirmError::Unknown`] and the caller asks for a new preview. Nothing is written to disk:
//! a token is worth nothing after a crash, which is the safe direction.
//!
//! With the feature `postgres`, `PendingActions::in_database` keeps them in the database every
//! replica shares (`pending/postgres.rs`): a preview issued by one replica can be confirmed on
//! another, once across all of them (the token's row is locked for the decision). The same rules
//! (`judge`, `summary_step`) decide in both places; times are the callers' wall clocks. The
//! database holds a live action's arguments and summary (as the process's memory does) and drops
//! them when the token dies.
//!
//! Tokens are 32 bytes from the operating system's random number generator (`getrandom`), shown as
//! 64 lowercase hex characters. Only their SHA-256 is stored; a presented token is hashed, looked
//! up by that hash, and the stored hash is compared with it in constant time.
//!
//! # Lifecycle
//!
//! A token is *live* from [`PendingActions::prepare`] until it is confirmed (*used*), rejected,
//! locked (after [`MAX_WRONG_SUMMARIES`] summaries that did not match), or expires (`ttl` after
//! issue). Dead tokens are remembered (without their action) until `ttl` after their expiry, so that
//! reusing one reports why it is dead rather than `token_unknown`; later calls then forget them.
//! Each principal may hold at most [`DEFAULT_MAX_PENDING_PER_PRINCIPAL`] live tokens (configurable),
//! so memory is bounded by principals × that cap, plus the tokens that died within the last `2·ttl`.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use serde_json::{Map, Value};
use subtle::ConstantTimeEq as _;
use toolgate_canon::Sha256Digest;

/// Live tokens one principal may hold by default.
pub const DEFAULT_MAX_PENDING_PER_PRINCIPAL: usize = 100;
/// After this many confirmations with a wrong summary the token is dead ([`ConfirmError::Locked`]).
pub const MAX_WRONG_SUMMARIES: u32 = 5;
/// Longest accepted time to live; a longer `ttl` is clamped to this.
pub const MAX_TTL: Duration = Duration::from_secs(7 * 24 * 3600);
/// Token length in hex characters (32 random bytes).
pub const TOKEN_HEX_LEN: usize = 64;

/// Why a confirmation step failed. Every message starts with [`ConfirmError::code`] and says what
/// to do; none reveals anything about the action or, for [`ConfirmError::Foreign`], the token's
/// state.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfirmError {
    /// The token is not 64 lowercase hex characters.
    #[error(
        "token_malformed: a confirmation token is 64 lowercase hex characters; pass the token \
         exactly as the preview returned it"
    )]
    Malformed,
    /// No pending action has this token in this process.
    #[error(
        "token_unknown: this server process has no pending action with this token (it was issued \
         by another process, before a restart, or expired long ago); call the tool again to get a \
         new preview"
    )]
    Unknown,
    /// The token was issued to a different principal. Nothing was consumed.
    #[error(
        "token_foreign: this token was issued to a different principal; only the principal that \
         received the preview can confirm or reject it; call the tool yourself to get your own \
         preview"
    )]
    Foreign,
    /// The action was already confirmed. Nothing was done again.
    #[error(
        "token_used: this action was already confirmed and is not done again; call the tool again \
         to get a new preview if you want it repeated"
    )]
    Used,
    /// The action was rejected.
    #[error("token_rejected: this action was rejected; call the tool again to get a new preview")]
    Rejected,
    /// The token expired before it was confirmed.
    #[error(
        "token_expired: the time to confirm this action has passed and nothing was done; call the \
         tool again to get a new preview"
    )]
    Expired,
    /// The summary differs from the preview's. Nothing was done; the token stays live unless this
    /// was the last allowed attempt.
    #[error(
        "summary_mismatch: the summary does not match the preview byte for byte and nothing was \
         done; pass the summary exactly as the preview returned it ({attempts_left} attempts left \
         before the token is invalidated{})",
        if *.attempts_left == 0 { "; it now is, so call the tool again to get a new preview" } else { "" }
    )]
    WrongSummary {
        /// How many more wrong summaries the token survives (0: it is now locked).
        attempts_left: u32,
    },
    /// The token was invalidated after too many wrong summaries.
    #[error(
        "token_locked: this token was invalidated after 5 summaries that did not match the \
         preview; call the tool again to get a new preview"
    )]
    Locked,
    /// The principal holds too many live tokens.
    #[error(
        "too_many_pending: this principal already has {limit} pending actions; confirm or reject \
         pending actions, or wait for them to expire"
    )]
    TooMany {
        /// The cap.
        limit: usize,
    },
    /// The store that holds pending actions (a database shared by replicas) could not be reached
    /// or failed; nothing was issued, confirmed or rejected.
    #[error(
        "store_unavailable: the pending actions cannot be reached ({cause}); nothing was done; \
         retry when the store is reachable"
    )]
    Store {
        /// The store's error, naming the database without credentials.
        cause: String,
    },
    /// The operating system's random number generator failed; no token was issued.
    #[error(
        "rng_unavailable: could not draw a confirmation token from the operating system's random \
         number generator ({cause}); check the host's entropy source and retry"
    )]
    Random {
        /// The generator's error.
        cause: String,
    },
}

impl ConfirmError {
    /// A short, stable code for tool results, e.g. `token_expired`.
    pub fn code(&self) -> &'static str {
        match self {
            ConfirmError::Malformed => "token_malformed",
            ConfirmError::Unknown => "token_unknown",
            ConfirmError::Foreign => "token_foreign",
            ConfirmError::Used => "token_used",
            ConfirmError::Rejected => "token_rejected",
            ConfirmError::Expired => "token_expired",
            ConfirmError::WrongSummary { .. } => "summary_mismatch",
            ConfirmError::Locked => "token_locked",
            ConfirmError::TooMany { .. } => "too_many_pending",
            ConfirmError::Random { .. } => "rng_unavailable",
            ConfirmError::Store { .. } => "store_unavailable",
        }
    }
}

/// An action awaiting confirmation: what the preview showed and what confirming will do.
#[derive(Clone, PartialEq, Eq)]
pub struct PendingAction {
    /// Who asked for the preview; only they may confirm or reject.
    pub principal: String,
    /// The tool to run on confirmation.
    pub tool: String,
    /// Its arguments.
    pub arguments: Map<String, Value>,
    /// SHA-256 of the canonical arguments (as recorded in the audit).
    pub args_digest: Sha256Digest,
    /// Hash of the content the preview showed (for example the state the action would change).
    pub content_hash: Sha256Digest,
    /// The summary shown by the preview; a confirmation must repeat it byte for byte.
    pub summary: String,
    /// The `_meta` idempotency key the previewed call carried: the confirmed call runs under it,
    /// whatever the `confirm_action` call's own `_meta` says, so that a preview retried with its
    /// key and then confirmed still executes at most once.
    pub idempotency_key: Option<String>,
}

impl fmt::Debug for PendingAction {
    // Arguments and summary may be sensitive; Debug output ends up in logs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PendingAction")
            .field("principal", &self.principal)
            .field("tool", &self.tool)
            .field(
                "arguments",
                &format_args!("<{} keys>", self.arguments.len()),
            )
            .field("args_digest", &self.args_digest)
            .field("content_hash", &self.content_hash)
            .field("summary", &format_args!("<{} bytes>", self.summary.len()))
            .field(
                "idempotency_key",
                &self.idempotency_key.as_ref().map(|_| "<set>"),
            )
            .finish()
    }
}

/// A confirmation token: 64 lowercase hex characters. `Display` and [`ConfirmToken::as_str`] give
/// the token; `Debug` does not (it is a bearer secret).
#[derive(Clone, PartialEq, Eq)]
pub struct ConfirmToken(String);

impl ConfirmToken {
    /// The token text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ConfirmToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for ConfirmToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ConfirmToken(<redacted>)")
    }
}

/// What [`PendingActions::prepare`] hands out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Issued {
    /// The token to return to the caller with the preview.
    pub token: ConfirmToken,
    /// When the token stops being accepted.
    pub expires_at: SystemTime,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TokenState {
    Live { wrong_summaries: u32 },
    Used,
    Rejected,
    Locked,
    Expired,
}

#[derive(Debug)]
struct Entry {
    /// SHA-256 of the token text, compared in constant time after the map lookup.
    token_hash: Sha256Digest,
    principal: String,
    expires_at: SystemTime,
    state: TokenState,
    /// Present while live; dropped when the token dies so that dead tokens cost little memory.
    action: Option<PendingAction>,
}

#[derive(Debug, Default)]
struct State {
    entries: HashMap<Sha256Digest, Entry>,
    /// (expiry, token hash) of every token issued and not yet forgotten; live ones are marked
    /// expired when their time comes.
    expiries: BTreeSet<(SystemTime, Sha256Digest)>,
    /// (time to forget, token hash): expiry + ttl.
    forgets: BTreeSet<(SystemTime, Sha256Digest)>,
    /// Live tokens per principal (principals with none are absent).
    live: HashMap<String, usize>,
}

impl State {
    fn sweep(&mut self, now: SystemTime) {
        while let Some(&(at, hash)) = self.expiries.first() {
            if at > now {
                break;
            }
            self.expiries.pop_first();
            if let Some(entry) = self.entries.get_mut(&hash)
                && matches!(entry.state, TokenState::Live { .. })
            {
                entry.state = TokenState::Expired;
                entry.action = None;
                decrement(&mut self.live, &entry.principal);
            }
        }
        while let Some(&(at, hash)) = self.forgets.first() {
            if at > now {
                break;
            }
            self.forgets.pop_first();
            self.entries.remove(&hash);
        }
    }

    /// The entry for `token`, after the checks common to confirm and reject (malformed, unknown,
    /// foreign, used, rejected, locked, expired), with the token still live.
    fn live_entry(
        &mut self,
        token: &str,
        principal: &str,
        now: SystemTime,
    ) -> Result<&mut Entry, ConfirmError> {
        if !is_token(token) {
            return Err(ConfirmError::Malformed);
        }
        let hash = Sha256Digest::of(token.as_bytes());
        self.sweep(now);
        let entry = self.entries.get_mut(&hash).ok_or(ConfirmError::Unknown)?;
        if !bool::from(entry.token_hash.as_bytes().ct_eq(hash.as_bytes())) {
            return Err(ConfirmError::Unknown);
        }
        let verdict = judge(
            &entry.principal,
            entry.state,
            entry.expires_at,
            principal,
            now,
        );
        if verdict == Err(ConfirmError::Expired) && matches!(entry.state, TokenState::Live { .. }) {
            // Defensive: the sweep above has already marked every token whose expiry is not
            // after `now`; this keeps the rule local should that ever change.
            entry.state = TokenState::Expired;
            entry.action = None;
            decrement(&mut self.live, principal);
        }
        verdict.map(|()| entry)
    }

    /// Ends a live entry's life in `state`, returning its action.
    fn finish(&mut self, token: &str, state: TokenState) -> Result<PendingAction, ConfirmError> {
        let hash = Sha256Digest::of(token.as_bytes());
        let entry = self.entries.get_mut(&hash).ok_or(ConfirmError::Unknown)?;
        entry.state = state;
        let action = entry.action.take();
        decrement(&mut self.live, &entry.principal);
        // A live entry always holds its action; Unknown is the safe answer if that ever broke.
        action.ok_or(ConfirmError::Unknown)
    }
}

fn decrement(live: &mut HashMap<String, usize>, principal: &str) {
    if let Some(count) = live.get_mut(principal) {
        *count = count.saturating_sub(1);
        if *count == 0 {
            live.remove(principal);
        }
    }
}

fn is_token(token: &str) -> bool {
    token.len() == TOKEN_HEX_LEN
        && token
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// The pending actions of this process (or of every replica on one database). Thread-safe; every
/// operation is atomic.
#[derive(Debug)]
pub struct PendingActions {
    ttl: Duration,
    max_per_principal: usize,
    store: Store,
}

/// Where pending actions are kept.
#[derive(Debug)]
enum Store {
    Memory(Mutex<State>),
    #[cfg(feature = "postgres")]
    Database(toolgate_storage::postgres::PgStore),
}

/// Why a confirmation or rejection cannot act on a token: the checks every store makes, in this
/// order, once it has found the token's entry (owner, state, expiry).
fn judge(
    owner: &str,
    state: TokenState,
    expires_at: SystemTime,
    principal: &str,
    now: SystemTime,
) -> Result<(), ConfirmError> {
    if owner != principal {
        return Err(ConfirmError::Foreign);
    }
    match state {
        TokenState::Used => Err(ConfirmError::Used),
        TokenState::Rejected => Err(ConfirmError::Rejected),
        TokenState::Locked => Err(ConfirmError::Locked),
        TokenState::Expired => Err(ConfirmError::Expired),
        TokenState::Live { .. } if now >= expires_at => Err(ConfirmError::Expired),
        TokenState::Live { .. } => Ok(()),
    }
}

/// A live token's next state when a summary is presented, and the answer: used on the exact
/// summary; otherwise one more wrong summary, and locked at the [`MAX_WRONG_SUMMARIES`]th.
fn summary_step(wrong_summaries: u32, matches: bool) -> (TokenState, Result<(), ConfirmError>) {
    if matches {
        return (TokenState::Used, Ok(()));
    }
    let wrong_summaries = wrong_summaries.saturating_add(1);
    let attempts_left = MAX_WRONG_SUMMARIES.saturating_sub(wrong_summaries);
    let next = if attempts_left == 0 {
        TokenState::Locked
    } else {
        TokenState::Live { wrong_summaries }
    };
    (next, Err(ConfirmError::WrongSummary { attempts_left }))
}

#[cfg(feature = "postgres")]
mod postgres;

// Without the feature `postgres` the store is memory only, and the matches below have one arm.
#[cfg_attr(
    not(feature = "postgres"),
    allow(clippy::infallible_destructuring_match)
)]
impl PendingActions {
    /// Pending actions in this process's memory. Tokens live `ttl` (clamped to [`MAX_TTL`]) and
    /// are remembered `ttl` after that.
    pub fn new(ttl: Duration) -> Self {
        PendingActions {
            ttl: ttl.min(MAX_TTL),
            max_per_principal: DEFAULT_MAX_PENDING_PER_PRINCIPAL,
            store: Store::Memory(Mutex::new(State::default())),
        }
    }

    /// Pending actions in the database of `store`, shared by every replica on it (creates or
    /// migrates their table); otherwise as [`PendingActions::new`].
    #[cfg(feature = "postgres")]
    pub fn in_database(
        ttl: Duration,
        store: toolgate_storage::postgres::PgStore,
    ) -> Result<Self, toolgate_storage::postgres::PgError> {
        postgres::migrate(&store)?;
        Ok(PendingActions {
            store: Store::Database(store),
            ..PendingActions::new(ttl)
        })
    }

    /// Sets how many live tokens one principal may hold (default
    /// [`DEFAULT_MAX_PENDING_PER_PRINCIPAL`]).
    pub fn with_max_per_principal(mut self, max: usize) -> Self {
        self.max_per_principal = max;
        self
    }

    /// The time to live.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// When a token issued at `now` expires, and when it is forgotten.
    fn lifetime(&self, now: SystemTime) -> (SystemTime, SystemTime) {
        // Overflow needs a clock near the end of SystemTime; such a token is born expired.
        let expires_at = now.checked_add(self.ttl).unwrap_or(now);
        let forget_at = expires_at.checked_add(self.ttl).unwrap_or(expires_at);
        (expires_at, forget_at)
    }

    /// Issues a token for `action`, valid until `now + ttl`.
    pub fn prepare(&self, action: PendingAction, now: SystemTime) -> Result<Issued, ConfirmError> {
        let (expires_at, forget_at) = self.lifetime(now);
        let state = match &self.store {
            Store::Memory(state) => state,
            #[cfg(feature = "postgres")]
            Store::Database(store) => {
                return postgres::prepare(
                    store,
                    action,
                    now,
                    (expires_at, forget_at),
                    self.max_per_principal,
                );
            }
        };
        let mut state = lock(state);
        state.sweep(now);
        let live = state.live.get(&action.principal).copied().unwrap_or(0);
        if live >= self.max_per_principal {
            return Err(ConfirmError::TooMany {
                limit: self.max_per_principal,
            });
        }
        let (token, hash) = loop {
            let token = random_token()?;
            let hash = Sha256Digest::of(token.as_bytes());
            // 2^-256 per pair; the loop exists so that even then two actions never share a token.
            if !state.entries.contains_key(&hash) {
                break (token, hash);
            }
        };
        *state.live.entry(action.principal.clone()).or_insert(0) += 1;
        state.expiries.insert((expires_at, hash));
        state.forgets.insert((forget_at, hash));
        state.entries.insert(
            hash,
            Entry {
                token_hash: hash,
                principal: action.principal.clone(),
                expires_at,
                state: TokenState::Live { wrong_summaries: 0 },
                action: Some(action),
            },
        );
        Ok(Issued {
            token: ConfirmToken(token),
            expires_at,
        })
    }

    /// Confirms the action of `token` for `principal` if `summary` is byte-for-byte the preview's.
    ///
    /// Checks, in this order: well-formed ([`ConfirmError::Malformed`]), known
    /// ([`ConfirmError::Unknown`]), same principal ([`ConfirmError::Foreign`]; does not consume
    /// and reveals nothing else), not used, rejected, locked, or expired, then the summary
    /// ([`ConfirmError::WrongSummary`]; does not consume, but the
    /// [`MAX_WRONG_SUMMARIES`]th wrong summary locks the token). On success the token is used,
    /// atomically: of concurrent confirmations of one token exactly one gets the action.
    pub fn confirm(
        &self,
        token: &str,
        summary: &str,
        principal: &str,
        now: SystemTime,
    ) -> Result<PendingAction, ConfirmError> {
        let state = match &self.store {
            Store::Memory(state) => state,
            #[cfg(feature = "postgres")]
            Store::Database(store) => {
                return postgres::decide(store, token, principal, now, Some(summary));
            }
        };
        let mut state = lock(state);
        let entry = state.live_entry(token, principal, now)?;
        let TokenState::Live { wrong_summaries } = entry.state else {
            return Err(ConfirmError::Unknown); // live_entry only returns live entries
        };
        let matches = entry
            .action
            .as_ref()
            .is_some_and(|a| a.summary.as_bytes() == summary.as_bytes());
        let (next, verdict) = summary_step(wrong_summaries, matches);
        if let TokenState::Live { .. } = next {
            entry.state = next;
            verdict?;
            return Err(ConfirmError::Unknown); // a token stays live only on a wrong summary
        }
        let action = state.finish(token, next)?;
        verdict.map(|()| action)
    }

    /// Rejects the action of `token` for `principal`, so it can never be confirmed; returns it.
    /// Errors as for [`PendingActions::confirm`] (no summary is needed).
    pub fn reject(
        &self,
        token: &str,
        principal: &str,
        now: SystemTime,
    ) -> Result<PendingAction, ConfirmError> {
        let state = match &self.store {
            Store::Memory(state) => state,
            #[cfg(feature = "postgres")]
            Store::Database(store) => return postgres::decide(store, token, principal, now, None),
        };
        let mut state = lock(state);
        state.live_entry(token, principal, now)?;
        state.finish(token, TokenState::Rejected)
    }

    /// How many live tokens `principal` holds at `now`.
    pub fn live_count(&self, principal: &str, now: SystemTime) -> Result<usize, ConfirmError> {
        match &self.store {
            Store::Memory(state) => {
                let mut state = lock(state);
                state.sweep(now);
                Ok(state.live.get(principal).copied().unwrap_or(0))
            }
            #[cfg(feature = "postgres")]
            Store::Database(store) => postgres::count(store, Some(principal), now),
        }
    }

    /// How many tokens (live or remembered dead ones) are held at `now`.
    pub fn len(&self, now: SystemTime) -> Result<usize, ConfirmError> {
        match &self.store {
            Store::Memory(state) => {
                let mut state = lock(state);
                state.sweep(now);
                Ok(state.entries.len())
            }
            #[cfg(feature = "postgres")]
            Store::Database(store) => postgres::count(store, None, now),
        }
    }
}

fn lock(state: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    // A poisoned lock means a thread panicked inside an operation. Each operation changes at
    // most one entry's state plus the counters, so the worst case is a live count off by one
    // (which the expiry sweep never drives below zero); continuing beats refusing forever.
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

/// 32 random bytes as 64 lowercase hex characters.
fn random_token() -> Result<String, ConfirmError> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| ConfirmError::Random {
        cause: e.to_string(),
    })?;
    Ok(Sha256Digest::from_bytes(bytes).to_hex())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Barrier};

    const TTL: Duration = Duration::from_secs(300);

    fn t(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + secs)
    }

    fn action(principal: &str) -> PendingAction {
        let mut arguments = Map::new();
        arguments.insert("path".to_owned(), Value::from("/srv/notes/a.txt"));
        PendingAction {
            principal: principal.to_owned(),
            tool: "delete_note".to_owned(),
            args_digest: Sha256Digest::of_json_object(&arguments),
            arguments,
            content_hash: Sha256Digest::of(b"content"),
            summary: "delete note a.txt (12 bytes)".to_owned(),
            idempotency_key: Some("preview-key-1".to_owned()),
        }
    }

    fn issue(p: &PendingActions, principal: &str, now: SystemTime) -> String {
        p.prepare(action(principal), now).unwrap().token.to_string()
    }

    const SUMMARY: &str = "delete note a.txt (12 bytes)";

    /// The same pending actions in every store: memory, and with the feature `postgres` a fresh
    /// database of the test process's PostgreSQL cluster.
    fn stores(ttl: Duration) -> Vec<PendingActions> {
        #[allow(unused_mut)]
        let mut stores = vec![PendingActions::new(ttl)];
        #[cfg(feature = "postgres")]
        {
            let url = toolgate_pgtest::PgCluster::shared()
                .unwrap()
                .create_database("pending")
                .unwrap();
            let store = toolgate_storage::postgres::PgStore::connect(&url).unwrap();
            stores.push(PendingActions::in_database(ttl, store).unwrap());
        }
        stores
    }

    impl PendingActions {
        fn live_count_ok(&self, principal: &str, now: SystemTime) -> usize {
            self.live_count(principal, now).unwrap()
        }

        fn len_ok(&self, now: SystemTime) -> usize {
            self.len(now).unwrap()
        }
    }

    #[test]
    fn prepare_then_confirm_returns_the_action_once() {
        for p in stores(TTL) {
            let issued = p.prepare(action("alice"), t(0)).unwrap();
            assert_eq!(issued.expires_at, t(300));
            let token = issued.token.as_str();
            assert!(is_token(token));
            assert_eq!(p.live_count_ok("alice", t(1)), 1);
            let got = p.confirm(token, SUMMARY, "alice", t(1)).unwrap();
            assert_eq!(got, action("alice"));
            assert_eq!(p.live_count_ok("alice", t(1)), 0);
            assert_eq!(
                p.confirm(token, SUMMARY, "alice", t(2)),
                Err(ConfirmError::Used)
            );
            assert_eq!(p.reject(token, "alice", t(2)), Err(ConfirmError::Used));
        }
    }

    #[test]
    fn tokens_are_distinct_random_hex_and_redacted_in_debug() {
        for p in stores(TTL) {
            let a = p.prepare(action("alice"), t(0)).unwrap();
            let b = p.prepare(action("alice"), t(0)).unwrap();
            assert_ne!(a.token, b.token);
            assert_eq!(a.token.as_str().len(), 64);
            assert!(!format!("{a:?}").contains(a.token.as_str()));
            assert!(!format!("{:?}", action("alice")).contains("/srv/notes"));
        }
    }

    #[test]
    fn the_token_itself_is_not_stored() {
        let p = PendingActions::new(TTL);
        let token = issue(&p, "alice", t(0));
        // Irrefutable without the feature `postgres`.
        #[allow(irrefutable_let_patterns)]
        let Store::Memory(state) = &p.store else {
            unreachable!("PendingActions::new keeps them in memory")
        };
        let dump = format!("{:?}", state.lock().unwrap());
        assert!(!dump.contains(&token));
        assert!(dump.contains(&Sha256Digest::of(token.as_bytes()).to_hex()));
    }

    #[test]
    fn malformed_and_unknown_tokens() {
        for p in stores(TTL) {
            for bad in [
                "",
                "abc",
                &"A".repeat(64),
                &"g".repeat(64),
                &"a".repeat(65),
                &"é".repeat(32),
            ] {
                assert_eq!(
                    p.confirm(bad, SUMMARY, "alice", t(0)),
                    Err(ConfirmError::Malformed)
                );
                assert_eq!(p.reject(bad, "alice", t(0)), Err(ConfirmError::Malformed));
            }
            let unknown = "0".repeat(64);
            assert_eq!(
                p.confirm(&unknown, SUMMARY, "alice", t(0)),
                Err(ConfirmError::Unknown)
            );
            assert_eq!(
                p.reject(&unknown, "alice", t(0)),
                Err(ConfirmError::Unknown)
            );
        }
    }

    #[test]
    fn foreign_principal_is_refused_without_consuming() {
        for p in stores(TTL) {
            let token = issue(&p, "alice", t(0));
            assert_eq!(
                p.confirm(&token, SUMMARY, "bob", t(1)),
                Err(ConfirmError::Foreign)
            );
            assert_eq!(p.reject(&token, "bob", t(1)), Err(ConfirmError::Foreign));
            // Wrong summaries from bob would not count either: still 5 attempts for alice.
            for _ in 0..10 {
                assert_eq!(
                    p.confirm(&token, "x", "bob", t(1)),
                    Err(ConfirmError::Foreign)
                );
            }
            p.confirm(&token, SUMMARY, "alice", t(2)).unwrap();
            // After use, bob still learns only "foreign", not "used".
            assert_eq!(
                p.confirm(&token, SUMMARY, "bob", t(3)),
                Err(ConfirmError::Foreign)
            );
            assert!(!ConfirmError::Foreign.to_string().contains("used"));
        }
    }

    #[test]
    fn reject_kills_the_token() {
        for p in stores(TTL) {
            let token = issue(&p, "alice", t(0));
            assert_eq!(p.reject(&token, "alice", t(1)).unwrap(), action("alice"));
            assert_eq!(
                p.confirm(&token, SUMMARY, "alice", t(2)),
                Err(ConfirmError::Rejected)
            );
            assert_eq!(p.reject(&token, "alice", t(2)), Err(ConfirmError::Rejected));
            assert_eq!(p.live_count_ok("alice", t(2)), 0);
        }
    }

    #[test]
    fn expiry_then_forgetting() {
        for p in stores(TTL) {
            let token = issue(&p, "alice", t(0));
            assert_eq!(
                p.confirm(&token, SUMMARY, "alice", t(300)),
                Err(ConfirmError::Expired)
            );
            assert_eq!(
                p.reject(&token, "alice", t(400)),
                Err(ConfirmError::Expired)
            );
            assert_eq!(p.live_count_ok("alice", t(300)), 0);
            // Remembered until ttl after expiry, then unknown.
            assert_eq!(
                p.confirm(&token, SUMMARY, "alice", t(599)),
                Err(ConfirmError::Expired)
            );
            assert_eq!(
                p.confirm(&token, SUMMARY, "alice", t(600)),
                Err(ConfirmError::Unknown)
            );
            assert_eq!(p.len_ok(t(600)), 0);
        }
    }

    #[test]
    fn used_and_rejected_are_remembered_then_swept() {
        for p in stores(TTL) {
            let used = issue(&p, "alice", t(0));
            let rejected = issue(&p, "alice", t(0));
            p.confirm(&used, SUMMARY, "alice", t(1)).unwrap();
            p.reject(&rejected, "alice", t(1)).unwrap();
            // Used beats expired: a reuse after expiry still says why it is dead.
            assert_eq!(
                p.confirm(&used, SUMMARY, "alice", t(400)),
                Err(ConfirmError::Used)
            );
            assert_eq!(
                p.confirm(&rejected, SUMMARY, "alice", t(400)),
                Err(ConfirmError::Rejected)
            );
            assert_eq!(p.len_ok(t(599)), 2);
            assert_eq!(p.len_ok(t(600)), 0);
            assert_eq!(
                p.confirm(&used, SUMMARY, "alice", t(600)),
                Err(ConfirmError::Unknown)
            );
        }
    }

    #[test]
    fn wrong_summary_does_not_consume_until_the_fifth() {
        for p in stores(TTL) {
            let token = issue(&p, "alice", t(0));
            // Byte-exact: trailing space, case and Unicode normalisation all differ.
            for (i, wrong) in [
                "delete note a.txt (12 bytes) ",
                "Delete note a.txt (12 bytes)",
                "",
            ]
            .iter()
            .enumerate()
            {
                let left = MAX_WRONG_SUMMARIES - 1 - u32::try_from(i).unwrap();
                assert_eq!(
                    p.confirm(&token, wrong, "alice", t(1)),
                    Err(ConfirmError::WrongSummary {
                        attempts_left: left
                    })
                );
            }
            p.confirm(&token, SUMMARY, "alice", t(2)).unwrap();

            let token = issue(&p, "alice", t(0));
            for left in (0..MAX_WRONG_SUMMARIES).rev() {
                assert_eq!(
                    p.confirm(&token, "nope", "alice", t(1)),
                    Err(ConfirmError::WrongSummary {
                        attempts_left: left
                    })
                );
            }
            assert_eq!(
                p.confirm(&token, SUMMARY, "alice", t(1)),
                Err(ConfirmError::Locked)
            );
            assert_eq!(p.reject(&token, "alice", t(1)), Err(ConfirmError::Locked));
            assert_eq!(p.live_count_ok("alice", t(1)), 0);
            assert!(
                ConfirmError::WrongSummary { attempts_left: 0 }
                    .to_string()
                    .contains("get a new preview")
            );
        }
    }

    #[test]
    fn cap_per_principal() {
        for p in stores(TTL) {
            let p = p.with_max_per_principal(3);
            let tokens: Vec<_> = (0..3).map(|_| issue(&p, "alice", t(0))).collect();
            let err = p.prepare(action("alice"), t(0)).unwrap_err();
            assert_eq!(err, ConfirmError::TooMany { limit: 3 });
            assert!(
                err.to_string()
                    .contains("confirm or reject pending actions, or wait for them to expire")
            );
            // Other principals are unaffected.
            issue(&p, "bob", t(0));
            // Confirming, rejecting or expiry frees a slot.
            p.confirm(&tokens[0], SUMMARY, "alice", t(1)).unwrap();
            issue(&p, "alice", t(1));
            p.reject(&tokens[1], "alice", t(1)).unwrap();
            issue(&p, "alice", t(1));
            assert!(p.prepare(action("alice"), t(299)).is_err());
            issue(&p, "alice", t(300));
        }
    }

    #[test]
    fn default_cap_is_100() {
        for p in stores(TTL) {
            for _ in 0..100 {
                issue(&p, "alice", t(0));
            }
            assert_eq!(
                p.prepare(action("alice"), t(0)),
                Err(ConfirmError::TooMany { limit: 100 })
            );
        }
    }

    #[test]
    fn concurrent_confirms_of_one_token_exactly_one_wins() {
        for p in stores(TTL) {
            let p = Arc::new(p);
            for _ in 0..50 {
                let token = issue(&p, "alice", t(0));
                let barrier = Arc::new(Barrier::new(2));
                let handles: Vec<_> = (0..2)
                    .map(|_| {
                        let (p, token, barrier) =
                            (Arc::clone(&p), token.clone(), Arc::clone(&barrier));
                        std::thread::spawn(move || {
                            barrier.wait();
                            p.confirm(&token, SUMMARY, "alice", t(1))
                        })
                    })
                    .collect();
                let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
                assert_eq!(
                    results.iter().filter(|r| r.is_ok()).count(),
                    1,
                    "{results:?}"
                );
                assert!(results.contains(&Err(ConfirmError::Used)));
            }
        }
    }

    #[test]
    fn memory_is_bounded_by_sweeping() {
        for p in stores(Duration::from_secs(10)) {
            for i in 0..1_000 {
                let token = issue(&p, "alice", t(i));
                if i % 2 == 0 {
                    p.confirm(&token, SUMMARY, "alice", t(i)).unwrap();
                }
            }
            // Only tokens issued in the last 2·ttl remain.
            assert!(p.len_ok(t(1_000)) <= 20, "{}", p.len_ok(t(1_000)));
            assert_eq!(p.len_ok(t(2_000)), 0);
        }
    }

    #[test]
    fn codes_prefix_messages() {
        let all = [
            ConfirmError::Malformed,
            ConfirmError::Unknown,
            ConfirmError::Foreign,
            ConfirmError::Used,
            ConfirmError::Rejected,
            ConfirmError::Expired,
            ConfirmError::WrongSummary { attempts_left: 2 },
            ConfirmError::Locked,
            ConfirmError::TooMany { limit: 100 },
            ConfirmError::Random {
                cause: "x".to_owned(),
            },
            ConfirmError::Store {
                cause: "x".to_owned(),
            },
        ];
        for e in all {
            assert!(e.to_string().starts_with(&format!("{}: ", e.code())), "{e}");
        }
        assert!(
            ConfirmError::Expired
                .to_string()
                .contains("call the tool again to get a new preview")
        );
    }

    #[test]
    fn ttl_is_clamped_and_clock_edge_cases_do_not_panic() {
        let p = PendingActions::new(Duration::MAX);
        assert_eq!(p.ttl(), MAX_TTL);
        // A clock that goes backwards after expiry: the token stays expired.
        let p = PendingActions::new(Duration::from_secs(10));
        let token = issue(&p, "alice", t(0));
        assert_eq!(
            p.confirm(&token, SUMMARY, "alice", t(10)),
            Err(ConfirmError::Expired)
        );
        assert_eq!(
            p.confirm(&token, SUMMARY, "alice", t(5)),
            Err(ConfirmError::Expired)
        );
        // ttl zero: born expired and, with nothing to remember it for, forgotten at once.
        let p = PendingActions::new(Duration::ZERO);
        let token = issue(&p, "alice", t(0));
        assert_eq!(
            p.confirm(&token, SUMMARY, "alice", t(0)),
            Err(ConfirmError::Unknown)
        );
        assert_eq!(p.len_ok(t(0)), 0);
    }

    /// A database that stops answering issues, confirms and rejects nothing, saying why
    /// without the password; a token issued before is confirmed once it is back.
    #[cfg(feature = "postgres")]
    #[test]
    fn database_failures_do_nothing_and_name_the_cause() {
        let cluster = toolgate_pgtest::PgCluster::start().unwrap();
        let url = cluster.create_database("pending_down").unwrap();
        let store = toolgate_storage::postgres::PgStore::connect(&url).unwrap();
        let p = PendingActions::in_database(TTL, store).unwrap();
        let token = issue(&p, "alice", t(0));
        cluster.stop_immediate().unwrap();
        let refusals = [
            p.prepare(action("alice"), t(1)).map(drop),
            p.confirm(&token, SUMMARY, "alice", t(1)).map(drop),
            p.reject(&token, "alice", t(1)).map(drop),
        ];
        for refusal in refusals {
            let error = refusal.unwrap_err();
            assert_eq!(error.code(), "store_unavailable", "{error}");
            assert!(error.to_string().contains("PostgreSQL"), "{error}");
            assert!(
                !error.to_string().contains(toolgate_pgtest::PASSWORD),
                "{error}"
            );
        }
        cluster.start_again().unwrap();
        let confirmed = (0..300).find_map(|_| match p.confirm(&token, SUMMARY, "alice", t(2)) {
            Err(ConfirmError::Store { .. }) => {
                std::thread::sleep(Duration::from_millis(100));
                None
            }
            other => Some(other),
        });
        assert_eq!(confirmed, Some(Ok(action("alice"))));
    }
}
