//! Pending two-step actions: a preview issues a one-time token, a later call confirms (or rejects)
//! it by repeating the preview's summary.
//!
//! By default pending actions live **in the memory of one process**. A confirmation must reach
//! the server process that issued the preview; after a restart, or on another replica, the token
//! is [`ConfirmError::Unknown`] and the caller asks for a new preview. Nothing is written to disk:
//! a token is worth nothing after a crash, which is the safe direction.
//!
//! `toolgate_postgres::PgPending` keeps them in the database every replica shares: a preview
//! issued by one replica can be confirmed on another, once across all of them (the token's row
//! is locked for the decision). The same rules ([`judge`], [`summary_step`]) decide in every
//! store ([`PendingStore`]); times are the callers' wall clocks. The
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
use std::sync::{Arc, Mutex, PoisonError};
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
    /// A fresh token: 32 bytes from the operating system's random number generator.
    pub fn random() -> Result<Self, ConfirmError> {
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes).map_err(|e| ConfirmError::Random {
            cause: e.to_string(),
        })?;
        Ok(ConfirmToken(Sha256Digest::from_bytes(bytes).to_hex()))
    }

    /// What a store keeps instead of the token: its SHA-256.
    pub fn hash(&self) -> Sha256Digest {
        Sha256Digest::of(self.0.as_bytes())
    }

    /// Whether `token` has the form of a token (64 lowercase hex characters).
    pub fn is_well_formed(token: &str) -> bool {
        token.len() == TOKEN_HEX_LEN
            && token
                .bytes()
                .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    }

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

/// A token's state in a store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenState {
    /// Awaiting its confirmation, after this many summaries that did not match.
    Live {
        /// Summaries presented that did not match the preview's.
        wrong_summaries: u32,
    },
    /// Confirmed: its action was handed out.
    Used,
    /// Rejected by its principal.
    Rejected,
    /// Locked after [`MAX_WRONG_SUMMARIES`] wrong summaries.
    Locked,
    /// Past its expiry.
    Expired,
}

impl TokenState {
    /// The state's name as a store keeps it: `live`, `used`, `rejected`, `locked`, `expired`.
    pub fn name(self) -> &'static str {
        match self {
            TokenState::Live { .. } => "live",
            TokenState::Used => "used",
            TokenState::Rejected => "rejected",
            TokenState::Locked => "locked",
            TokenState::Expired => "expired",
        }
    }

    /// The state a store keeps as `name` (a live one after `wrong_summaries`). A name this
    /// version does not know reads as expired: dead, the safe reading.
    pub fn from_name(name: &str, wrong_summaries: u32) -> TokenState {
        match name {
            "live" => TokenState::Live { wrong_summaries },
            "used" => TokenState::Used,
            "rejected" => TokenState::Rejected,
            "locked" => TokenState::Locked,
            _ => TokenState::Expired,
        }
    }
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
        if !ConfirmToken::is_well_formed(token) {
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

/// The pending actions of this process (or of every replica on one database). Thread-safe; every
/// operation is atomic.
#[derive(Debug, Clone)]
pub struct PendingActions {
    ttl: Duration,
    max_per_principal: usize,
    store: Arc<dyn PendingStore>,
}

/// When a token stops being accepted, and when a store forgets it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lifetime {
    /// From then on the token is [`ConfirmError::Expired`].
    pub expires_at: SystemTime,
    /// From then on the token is [`ConfirmError::Unknown`] (a store may forget it).
    pub forget_at: SystemTime,
}

/// Where pending actions are kept: this process's memory ([`MemoryPending`]) or a database every
/// replica shares (`toolgate_postgres::PgPending`). The conformance suite
/// (`crates/toolgate-postgres/tests/pending_conformance.rs`) runs the same cases against every
/// store.
///
/// What every store guarantees: `issue` stores the action under a fresh random token (only its
/// SHA-256 is kept) unless its principal already holds `max_live` live tokens; `decide` finds the
/// token's entry and applies [`judge`] then, for a confirmation, [`summary_step`], atomically
/// with respect to every other decision on the same token (of concurrent confirmations exactly
/// one gets the action); a dead token loses its action and is remembered until `forget_at`.
/// `Err(ConfirmError::Store)` means the store could not be reached and nothing changed.
pub trait PendingStore: Send + Sync + fmt::Debug {
    /// Issues a token for `action` at `now`, living for `lifetime`.
    fn issue(
        &self,
        action: PendingAction,
        now: SystemTime,
        lifetime: Lifetime,
        max_live: usize,
    ) -> Result<ConfirmToken, ConfirmError>;

    /// Confirms (`summary` given) or rejects (`None`) the action of `token` for `principal`.
    fn decide(
        &self,
        token: &str,
        principal: &str,
        now: SystemTime,
        summary: Option<&str>,
    ) -> Result<PendingAction, ConfirmError>;

    /// Live tokens of `principal`, or every remembered token (`None`), at `now`.
    fn count(&self, principal: Option<&str>, now: SystemTime) -> Result<usize, ConfirmError>;
}

/// Why a confirmation or rejection cannot act on a token: the checks every store makes, in this
/// order, once it has found the token's entry (owner, state, expiry).
pub fn judge(
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
pub fn summary_step(wrong_summaries: u32, matches: bool) -> (TokenState, Result<(), ConfirmError>) {
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

impl PendingActions {
    /// Pending actions in this process's memory. Tokens live `ttl` (clamped to [`MAX_TTL`]) and
    /// are remembered `ttl` after that.
    pub fn new(ttl: Duration) -> Self {
        PendingActions::with_store(ttl, Arc::new(MemoryPending::default()))
    }

    /// Pending actions in `store` (for example the database every replica shares); otherwise
    /// as [`PendingActions::new`].
    pub fn with_store(ttl: Duration, store: Arc<dyn PendingStore>) -> Self {
        PendingActions {
            ttl: ttl.min(MAX_TTL),
            max_per_principal: DEFAULT_MAX_PENDING_PER_PRINCIPAL,
            store,
        }
    }

    /// The same store with tokens living `ttl` (clamped to [`MAX_TTL`]).
    pub fn with_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl.min(MAX_TTL);
        self
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
    fn lifetime(&self, now: SystemTime) -> Lifetime {
        // Overflow needs a clock near the end of SystemTime; such a token is born expired.
        let expires_at = now.checked_add(self.ttl).unwrap_or(now);
        let forget_at = expires_at.checked_add(self.ttl).unwrap_or(expires_at);
        Lifetime {
            expires_at,
            forget_at,
        }
    }

    /// Issues a token for `action`, valid until `now + ttl`.
    pub fn prepare(&self, action: PendingAction, now: SystemTime) -> Result<Issued, ConfirmError> {
        let lifetime = self.lifetime(now);
        let token = self
            .store
            .issue(action, now, lifetime, self.max_per_principal)?;
        Ok(Issued {
            token,
            expires_at: lifetime.expires_at,
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
        self.store.decide(token, principal, now, Some(summary))
    }

    /// Rejects the action of `token` for `principal`, so it can never be confirmed; returns it.
    /// Errors as for [`PendingActions::confirm`] (no summary is needed).
    pub fn reject(
        &self,
        token: &str,
        principal: &str,
        now: SystemTime,
    ) -> Result<PendingAction, ConfirmError> {
        self.store.decide(token, principal, now, None)
    }

    /// How many live tokens `principal` holds at `now`.
    pub fn live_count(&self, principal: &str, now: SystemTime) -> Result<usize, ConfirmError> {
        self.store.count(Some(principal), now)
    }

    /// How many tokens (live or remembered dead ones) are held at `now`.
    pub fn len(&self, now: SystemTime) -> Result<usize, ConfirmError> {
        self.store.count(None, now)
    }
}

/// Pending actions in this process's memory (see the [module documentation](self)).
#[derive(Debug, Default)]
pub struct MemoryPending {
    state: Mutex<State>,
}

impl PendingStore for MemoryPending {
    fn issue(
        &self,
        action: PendingAction,
        now: SystemTime,
        lifetime: Lifetime,
        max_live: usize,
    ) -> Result<ConfirmToken, ConfirmError> {
        let mut state = lock(&self.state);
        state.sweep(now);
        let live = state.live.get(&action.principal).copied().unwrap_or(0);
        if live >= max_live {
            return Err(ConfirmError::TooMany { limit: max_live });
        }
        let (token, hash) = loop {
            let token = ConfirmToken::random()?;
            let hash = token.hash();
            // 2^-256 per pair; the loop exists so that even then two actions never share a token.
            if !state.entries.contains_key(&hash) {
                break (token, hash);
            }
        };
        *state.live.entry(action.principal.clone()).or_insert(0) += 1;
        state.expiries.insert((lifetime.expires_at, hash));
        state.forgets.insert((lifetime.forget_at, hash));
        state.entries.insert(
            hash,
            Entry {
                token_hash: hash,
                principal: action.principal.clone(),
                expires_at: lifetime.expires_at,
                state: TokenState::Live { wrong_summaries: 0 },
                action: Some(action),
            },
        );
        Ok(token)
    }

    fn decide(
        &self,
        token: &str,
        principal: &str,
        now: SystemTime,
        summary: Option<&str>,
    ) -> Result<PendingAction, ConfirmError> {
        let mut state = lock(&self.state);
        let entry = state.live_entry(token, principal, now)?;
        let Some(summary) = summary else {
            return state.finish(token, TokenState::Rejected);
        };
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

    fn count(&self, principal: Option<&str>, now: SystemTime) -> Result<usize, ConfirmError> {
        let mut state = lock(&self.state);
        state.sweep(now);
        Ok(match principal {
            Some(principal) => state.live.get(principal).copied().unwrap_or(0),
            None => state.entries.len(),
        })
    }
}

/// The name of the pending confirmations' file in its directory.
pub const PENDING_FILE_NAME: &str = "pending.json";
/// The name of the lock file every process deciding on them holds while it does.
pub const PENDING_LOCK_NAME: &str = "pending.lock";
/// A pending confirmations file larger than this is refused as invalid.
pub const MAX_PENDING_FILE_BYTES: u64 = 64 * 1024 * 1024;

/// Pending actions in a file shared by every process on one directory (a ledger): a preview issued
/// by one process can be confirmed once on another, and survives a restart. Every operation holds
/// `<dir>/pending.lock` (an advisory `flock`), reads `<dir>/pending.json`, forgets and expires
/// what is due, decides by the same rules as memory ([`judge`], [`summary_step`]), and replaces
/// the file atomically and durably (a temporary file, fsync, rename, fsync of the directory)
/// before it answers, so of concurrent confirmations of one token exactly one gets the action, and
/// a crash never revives a used token.
///
/// Only a token's SHA-256 is stored. A live action's arguments and summary are in the file (as
/// they are in the memory of the process that issued it), dropped when the token dies: keep the
/// directory readable by the server only. A file that cannot be read or parsed refuses every
/// preview and confirmation ([`ConfirmError::Store`]), naming the file and the fix.
#[derive(Debug)]
pub struct FilePending {
    dir: std::path::PathBuf,
    storage: Arc<dyn toolgate_storage::Storage>,
    /// Opened on first use; threads of this process take turns on it.
    lock: Mutex<Option<toolgate_storage::LockFile>>,
}

/// One token's entry in the file.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct FileEntry {
    principal: String,
    expires_ns: u64,
    forget_ns: u64,
    state: String,
    wrong_summaries: u32,
    /// Present while live.
    action: Option<FileAction>,
}

/// A live token's action in the file.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct FileAction {
    tool: String,
    arguments: Map<String, Value>,
    args_digest: Sha256Digest,
    content_hash: Sha256Digest,
    summary: String,
    idempotency_key: Option<String>,
}

/// The file: entries by the hex SHA-256 of their token.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct FileDocument {
    version: u64,
    tokens: std::collections::BTreeMap<String, FileEntry>,
}

fn nanos(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

impl FileDocument {
    /// Forgets what is past its time to forget, and expires the live tokens past their expiry.
    fn sweep(&mut self, now: u64) {
        self.tokens.retain(|_, entry| entry.forget_ns > now);
        for entry in self.tokens.values_mut() {
            if entry.state == "live" && entry.expires_ns <= now {
                entry.state = "expired".to_owned();
                entry.action = None;
            }
        }
    }

    fn live_of(&self, principal: &str) -> usize {
        self.tokens
            .values()
            .filter(|entry| entry.state == "live" && entry.principal == principal)
            .count()
    }
}

impl FilePending {
    /// The pending actions of `dir` (created on first use), on the filesystem.
    pub fn new(dir: impl Into<std::path::PathBuf>) -> Self {
        FilePending {
            dir: dir.into(),
            storage: Arc::new(toolgate_storage::FsStorage),
            lock: Mutex::new(None),
        }
    }

    /// Writes through `storage` (fault injection in tests) instead of the filesystem.
    pub fn with_storage(mut self, storage: Arc<dyn toolgate_storage::Storage>) -> Self {
        self.storage = storage;
        self
    }

    /// The pending actions' file.
    pub fn path(&self) -> std::path::PathBuf {
        self.dir.join(PENDING_FILE_NAME)
    }

    fn unavailable(&self, what: &str, error: impl fmt::Display) -> ConfirmError {
        ConfirmError::Store {
            cause: format!("{what} {}: {error}", self.path().display()),
        }
    }

    /// Runs `job` on the document under the lock; writes it back when `job` says it changed it.
    fn with_document<T>(
        &self,
        now: SystemTime,
        job: impl FnOnce(&mut FileDocument) -> (bool, Result<T, ConfirmError>),
    ) -> Result<T, ConfirmError> {
        let mut lock = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
        if lock.is_none() {
            toolgate_storage::create_dir_durably(&*self.storage, &self.dir)
                .map_err(|e| self.unavailable("cannot create the directory of", e))?;
            *lock = Some(
                toolgate_storage::LockFile::open(self.dir.join(PENDING_LOCK_NAME))
                    .map_err(|e| self.unavailable("cannot open the lock of", e))?,
            );
        }
        let Some(file) = lock.as_ref() else {
            return Err(self.unavailable("cannot open the lock of", "not open"));
        };
        let _held = file
            .lock()
            .map_err(|e| self.unavailable("cannot take the lock of", e))?;
        let path = self.path();
        let mut document = match toolgate_storage::read_regular(
            &path,
            MAX_PENDING_FILE_BYTES,
            toolgate_storage::Symlinks::Refuse,
        ) {
            Ok(None) => FileDocument {
                version: 1,
                tokens: Default::default(),
            },
            Ok(Some(bytes)) => serde_json::from_slice::<FileDocument>(&bytes)
                .ok()
                .filter(|document| document.version == 1)
                .ok_or_else(|| {
                    self.unavailable(
                        "remove or repair (every pending confirmation in it is lost) the invalid file",
                        "not a version-1 pending confirmations file",
                    )
                })?,
            Err(e) => return Err(self.unavailable("cannot read", e)),
        };
        let before = document.tokens.len();
        document.sweep(nanos(now));
        let swept = document.tokens.len() != before;
        let (changed, answer) = job(&mut document);
        if changed || swept {
            let mut bytes =
                serde_json::to_vec(&document).map_err(|e| self.unavailable("cannot encode", e))?;
            bytes.push(b'\n');
            toolgate_storage::replace_file(&*self.storage, &self.dir, PENDING_FILE_NAME, &bytes)
                .map_err(|e| self.unavailable("cannot write", e))?;
        }
        answer
    }
}

impl PendingStore for FilePending {
    fn issue(
        &self,
        action: PendingAction,
        now: SystemTime,
        lifetime: Lifetime,
        max_live: usize,
    ) -> Result<ConfirmToken, ConfirmError> {
        self.with_document(now, |document| {
            if document.live_of(&action.principal) >= max_live {
                return (false, Err(ConfirmError::TooMany { limit: max_live }));
            }
            let token = loop {
                let token = match ConfirmToken::random() {
                    Ok(token) => token,
                    Err(error) => return (false, Err(error)),
                };
                // 2^-256 per pair; even then two actions never share a token.
                if !document.tokens.contains_key(&token.hash().to_hex()) {
                    break token;
                }
            };
            document.tokens.insert(
                token.hash().to_hex(),
                FileEntry {
                    principal: action.principal,
                    expires_ns: nanos(lifetime.expires_at),
                    forget_ns: nanos(lifetime.forget_at),
                    state: "live".to_owned(),
                    wrong_summaries: 0,
                    action: Some(FileAction {
                        tool: action.tool,
                        arguments: action.arguments,
                        args_digest: action.args_digest,
                        content_hash: action.content_hash,
                        summary: action.summary,
                        idempotency_key: action.idempotency_key,
                    }),
                },
            );
            (true, Ok(token))
        })
    }

    fn decide(
        &self,
        token: &str,
        principal: &str,
        now: SystemTime,
        summary: Option<&str>,
    ) -> Result<PendingAction, ConfirmError> {
        if !ConfirmToken::is_well_formed(token) {
            return Err(ConfirmError::Malformed);
        }
        let hash = Sha256Digest::of(token.as_bytes());
        self.with_document(now, |document| {
            // Looked up by the token's hash: the token itself is never stored or compared.
            let Some(entry) = document.tokens.get_mut(&hash.to_hex()) else {
                return (false, Err(ConfirmError::Unknown));
            };
            let expires_at = SystemTime::UNIX_EPOCH + Duration::from_nanos(entry.expires_ns);
            if let Err(error) = judge(
                &entry.principal,
                TokenState::from_name(&entry.state, entry.wrong_summaries),
                expires_at,
                principal,
                now,
            ) {
                return (false, Err(error));
            }
            let TokenState::Live { wrong_summaries } =
                TokenState::from_name(&entry.state, entry.wrong_summaries)
            else {
                return (false, Err(ConfirmError::Unknown));
            };
            let (next, verdict) = match summary {
                None => (TokenState::Rejected, Ok(())),
                Some(summary) => summary_step(
                    wrong_summaries,
                    entry
                        .action
                        .as_ref()
                        .is_some_and(|a| a.summary.as_bytes() == summary.as_bytes()),
                ),
            };
            entry.state = next.name().to_owned();
            if let TokenState::Live { wrong_summaries } = next {
                entry.wrong_summaries = wrong_summaries;
                return (true, verdict.and(Err(ConfirmError::Unknown)));
            }
            let action = entry.action.take();
            let owner = entry.principal.clone();
            let answer = verdict.and_then(|()| {
                let action = action.ok_or(ConfirmError::Unknown)?;
                Ok(PendingAction {
                    principal: owner,
                    tool: action.tool,
                    arguments: action.arguments,
                    args_digest: action.args_digest,
                    content_hash: action.content_hash,
                    summary: action.summary,
                    idempotency_key: action.idempotency_key,
                })
            });
            (true, answer)
        })
    }

    fn count(&self, principal: Option<&str>, now: SystemTime) -> Result<usize, ConfirmError> {
        self.with_document(now, |document| {
            let count = match principal {
                Some(principal) => document.live_of(principal),
                None => document.tokens.len(),
            };
            (false, Ok(count))
        })
    }
}

fn lock(state: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    // A poisoned lock means a thread panicked inside an operation. Each operation changes at
    // most one entry's state plus the counters, so the worst case is a live count off by one
    // (which the expiry sweep never drives below zero); continuing beats refusing forever.
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_itself_is_not_stored() {
        let store = MemoryPending::default();
        let mut arguments = Map::new();
        arguments.insert("path".to_owned(), Value::from("/srv/notes/a.txt"));
        let action = PendingAction {
            principal: "alice".to_owned(),
            tool: "delete_note".to_owned(),
            args_digest: Sha256Digest::of_json_object(&arguments),
            arguments,
            content_hash: Sha256Digest::of(b"content"),
            summary: "delete note a.txt (12 bytes)".to_owned(),
            idempotency_key: None,
        };
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let lifetime = Lifetime {
            expires_at: now + Duration::from_secs(300),
            forget_at: now + Duration::from_secs(600),
        };
        let token = store.issue(action, now, lifetime, 1).unwrap();
        let dump = format!("{:?}", store.state.lock().unwrap());
        assert!(!dump.contains(token.as_str()));
        assert!(dump.contains(&token.hash().to_hex()));
    }
}
