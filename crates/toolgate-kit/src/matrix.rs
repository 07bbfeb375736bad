//! The matrix: which calls run, in which order, and what is observed around them.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::time::Instant;
use toolgate_canon::{Sha256Digest, canonical_value};

use crate::error::KitError;
use crate::launch::{Connection, Launcher};
use crate::observe::{Observation, Observer, SavedState, outcome_difference};
use crate::report::{
    CallOutcome, CaseKind, CaseReport, CaseRun, Claims, ObservedStep, Report, Sequential,
    ToolReport, ToolStatus, judge, status, verdicts,
};

/// How long any single condition may take by default (a reply, a server's exit).
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);
/// How often [`CutOff::WhenObserved`] looks at the state while waiting (a poll, not a wait).
const OBSERVE_POLL: Duration = Duration::from_millis(5);
/// The longest excerpt of a result quoted in the report.
const EXCERPT_CHARS: usize = 160;

/// The arguments the matrix calls one tool with. Every fixture is a JSON object.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolFixtures {
    /// The tool's name.
    pub name: String,
    /// Case 1 and 2: a valid call, made once, then again byte for byte.
    pub valid: Value,
    /// Case 4: another valid call, not made before, so the cut-off call is a first execution.
    pub second_valid: Value,
    /// Case 3: a call with an invalid field (wrong type, unknown field, out of range).
    pub invalid: Value,
    /// Case 3: a call naming a resource that does not exist (`None` when the tool has none).
    pub missing_resource: Option<Value>,
    /// Case 3: a call for an operation the matrix already completed (usually `valid` itself, or
    /// its target); an idempotent tool must add no effect. `None` to skip.
    pub already_done: Option<Value>,
    /// Case 5: a fresh valid call (not made before) for the concurrent pair, whose outcome must
    /// then equal that of one such call from the same starting state (or, when the observer
    /// cannot restore, change no more records than case 1's single call). `None`: the pair
    /// repeats `valid`, already done (that misses races of a first execution).
    pub concurrent: Option<Value>,
    /// Case 6: a call that modifies state which exists before it, after the kit seeded that
    /// state. `None` to skip (then a tool that only ever writes fresh records in the other cases
    /// cannot contradict `destructiveHint: false`, and the report marks that claim untested).
    pub overwrite: Option<Overwrite>,
}

/// Case 6: how the kit creates existing state, and the call that then modifies it.
#[derive(Debug, Clone, PartialEq)]
pub struct Overwrite {
    /// What exists before the call.
    pub seed: Seed,
    /// The call that modifies (overwrites, edits, replaces) the seeded state.
    pub arguments: Value,
}

/// How the overwrite case creates the state its call modifies.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Seed {
    /// The kit writes the record into the observed state itself, with [`Observer::seed`]
    /// (for [`FsObserver`](crate::FsObserver): the file `<root name>/<relative path>`).
    Record {
        /// The record's name, as the observer names it.
        name: String,
        /// Its content.
        content: Vec<u8>,
    },
    /// A preparatory call of any listed tool creates it (it must succeed; its effects are
    /// reported, not judged).
    Call {
        /// The tool to call.
        tool: String,
        /// Its arguments.
        arguments: Value,
    },
}

impl Seed {
    /// The kit writes `content` as the record `name` before the call.
    pub fn record(name: impl Into<String>, content: impl Into<Vec<u8>>) -> Self {
        Seed::Record {
            name: name.into(),
            content: content.into(),
        }
    }

    /// A preparatory call of `tool` with `arguments` creates the state before the call.
    pub fn call(tool: impl Into<String>, arguments: Value) -> Self {
        Seed::Call {
            tool: tool.into(),
            arguments,
        }
    }

    fn describe(&self) -> String {
        match self {
            Seed::Record { name, content } => {
                format!("the kit wrote the record {name} ({} bytes)", content.len())
            }
            Seed::Call { tool, arguments } => {
                format!("preparatory call {}", request_text(tool, arguments))
            }
        }
    }
}

impl ToolFixtures {
    /// Fixtures with the three required calls; add the optional ones with the `with_` methods.
    pub fn new(name: impl Into<String>, valid: Value, second_valid: Value, invalid: Value) -> Self {
        ToolFixtures {
            name: name.into(),
            valid,
            second_valid,
            invalid,
            missing_resource: None,
            already_done: None,
            concurrent: None,
            overwrite: None,
        }
    }

    /// Sets [`ToolFixtures::missing_resource`].
    #[must_use]
    pub fn with_missing_resource(mut self, arguments: Value) -> Self {
        self.missing_resource = Some(arguments);
        self
    }

    /// Sets [`ToolFixtures::already_done`].
    #[must_use]
    pub fn with_already_done(mut self, arguments: Value) -> Self {
        self.already_done = Some(arguments);
        self
    }

    /// Sets [`ToolFixtures::concurrent`].
    #[must_use]
    pub fn with_concurrent(mut self, arguments: Value) -> Self {
        self.concurrent = Some(arguments);
        self
    }

    /// Sets [`ToolFixtures::overwrite`]: `seed` creates existing state, then `arguments`
    /// modify it. For a file tool, e.g. `Seed::record("state/notes.txt", "original\n")` and a
    /// call writing other content to that file.
    #[must_use]
    pub fn with_overwrite(mut self, seed: Seed, arguments: Value) -> Self {
        self.overwrite = Some(Overwrite { seed, arguments });
        self
    }

    fn check(&self) -> Result<(), KitError> {
        let seed_call = match &self.overwrite {
            Some(Overwrite {
                seed: Seed::Call { arguments, .. },
                ..
            }) => Some(arguments),
            _ => None,
        };
        let fixtures: [(&'static str, Option<&Value>); 8] = [
            ("valid", Some(&self.valid)),
            ("second_valid", Some(&self.second_valid)),
            ("invalid", Some(&self.invalid)),
            ("missing_resource", self.missing_resource.as_ref()),
            ("already_done", self.already_done.as_ref()),
            ("concurrent", self.concurrent.as_ref()),
            ("overwrite", self.overwrite.as_ref().map(|o| &o.arguments)),
            ("overwrite seed call", seed_call),
        ];
        for (fixture, value) in fixtures {
            if let Some(value) = value
                && !value.is_object()
            {
                return Err(KitError::Fixture {
                    tool: self.name.clone(),
                    fixture,
                    message: format!(
                        "tool arguments are a JSON object, got {value}; wrap them, e.g. {{\"path\": ...}}"
                    ),
                });
            }
        }
        Ok(())
    }
}

/// When case 4 cuts the first connection.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum CutOff {
    /// After the server wrote its response line: the client drops it unread and disconnects, as
    /// when a timeout hides a first success. The operation is complete, so the retry must add no
    /// effect at all for an idempotent tool. The default: the verdict is exact.
    #[default]
    AfterResponse,
    /// As soon as the observation differs from the one before the call, or the response line
    /// arrives, whichever comes first (the state is polled every few milliseconds). The call may
    /// be interrupted mid-flight, so its retry may legitimately finish it: only a retry that
    /// creates new records after the cut-off call had already created some contradicts
    /// `idempotentHint` (the duplicate-ticket pattern); appends are not judged.
    WhenObserved,
}

impl CutOff {
    fn describe(self) -> &'static str {
        match self {
            CutOff::AfterResponse => {
                "after the server wrote its response line (read and discarded, then the connection is closed); the retry runs on a new connection with a new JSON-RPC id"
            }
            CutOff::WhenObserved => {
                "as soon as the state changed or the response line arrived, whichever first; the retry runs on a new connection with a new JSON-RPC id"
            }
        }
    }
}

/// The adversarial matrix runner. See the crate documentation for the cases.
pub struct Kit {
    launcher: Launcher,
    tools: Vec<ToolFixtures>,
    observer: Option<Arc<dyn Observer>>,
    timeout: Duration,
    cut_off: CutOff,
}

impl fmt::Debug for Kit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Kit")
            .field("launcher", &self.launcher)
            .field("tools", &self.tools)
            .field("observer", &self.observer.as_ref().map(|o| o.describe()))
            .field("timeout", &self.timeout)
            .field("cut_off", &self.cut_off)
            .finish()
    }
}

impl Kit {
    /// A kit that starts servers with `launcher`.
    pub fn new(launcher: Launcher) -> Self {
        Kit {
            launcher,
            tools: Vec::new(),
            observer: None,
            timeout: DEFAULT_TIMEOUT,
            cut_off: CutOff::default(),
        }
    }

    /// Exercises a tool with these fixtures (tools listed without fixtures are reported as not
    /// exercised).
    #[must_use]
    pub fn tool(mut self, fixtures: ToolFixtures) -> Self {
        self.tools.push(fixtures);
        self
    }

    /// The state observer (required).
    #[must_use]
    pub fn observer(mut self, observer: impl Observer) -> Self {
        self.observer = Some(Arc::new(observer));
        self
    }

    /// How long any single condition may take (default 60 s).
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// When case 4 cuts the connection (default [`CutOff::AfterResponse`]).
    #[must_use]
    pub fn cut_off(mut self, cut_off: CutOff) -> Self {
        self.cut_off = cut_off;
        self
    }

    /// Runs the matrix for every tool with fixtures, in the order they were given.
    pub async fn run(self) -> Result<Report, KitError> {
        let started = Instant::now();
        let Some(observer) = self.observer.clone() else {
            return Err(KitError::NoObserver);
        };
        for fixtures in &self.tools {
            fixtures.check()?;
        }
        let runner = Runner {
            launcher: self.launcher.clone(),
            observer: observer.clone(),
            ids: Arc::new(AtomicU64::new(1)),
            timeout: self.timeout,
            cut_off: self.cut_off,
        };
        let mut connection = runner.open().await?;
        let listed = connection.list_tools().await?;
        connection.close().await?;
        let claims_of = |name: &str| {
            listed
                .iter()
                .find(|t| t["name"].as_str() == Some(name))
                .map(Claims::of_tool)
        };

        // Every named tool is checked before any case runs.
        for fixtures in &self.tools {
            let seed_tool = match &fixtures.overwrite {
                Some(Overwrite {
                    seed: Seed::Call { tool, .. },
                    ..
                }) => Some(tool),
                _ => None,
            };
            for tool in std::iter::once(&fixtures.name).chain(seed_tool) {
                if claims_of(tool).is_none() {
                    return Err(KitError::ToolNotListed { tool: tool.clone() });
                }
            }
        }
        let mut tools = Vec::new();
        for fixtures in &self.tools {
            let Some(claims) = claims_of(&fixtures.name) else {
                return Err(KitError::ToolNotListed {
                    tool: fixtures.name.clone(),
                });
            };
            let cases = runner.run_tool(fixtures, &claims).await?;
            let verdicts = verdicts(&claims, &cases);
            tools.push(ToolReport {
                name: fixtures.name.clone(),
                claims,
                status: status(&claims, &verdicts),
                verdicts,
                cases,
            });
        }
        for tool in &listed {
            let Some(name) = tool["name"].as_str() else {
                continue;
            };
            if self.tools.iter().all(|f| f.name != name) {
                let claims = Claims::of_tool(tool);
                tools.push(ToolReport {
                    name: name.to_owned(),
                    claims,
                    status: if claims.is_unclassified() {
                        ToolStatus::Unclassified
                    } else {
                        ToolStatus::NotExercised
                    },
                    verdicts: Vec::new(),
                    cases: Vec::new(),
                });
            }
        }
        Ok(Report {
            observer: observer.describe(),
            cut_off: self.cut_off.describe().to_owned(),
            tools,
            elapsed: started.elapsed(),
        })
    }
}

struct Runner {
    launcher: Launcher,
    observer: Arc<dyn Observer>,
    ids: Arc<AtomicU64>,
    timeout: Duration,
    cut_off: CutOff,
}

fn step(name: &str, before: &Observation, after: &Observation) -> ObservedStep {
    ObservedStep {
        step: name.to_owned(),
        changes: before.diff(after),
    }
}

fn call_params(tool: &str, arguments: &Value) -> Value {
    json!({"name": tool, "arguments": arguments})
}

fn request_text(tool: &str, arguments: &Value) -> String {
    format!(
        "{tool} {}",
        String::from_utf8_lossy(&canonical_value(arguments))
    )
}

fn excerpt(value: &Value) -> String {
    let text = match value {
        // One line per field in the report: control characters are shown escaped.
        Value::String(s) => s
            .chars()
            .flat_map(|c| match c {
                '\n' => vec!['\\', 'n'],
                '\r' => vec!['\\', 'r'],
                '\t' => vec!['\\', 't'],
                c if c.is_control() => c.escape_unicode().collect(),
                c => vec![c],
            })
            .collect(),
        other => other.to_string(),
    };
    let mut chars = text.chars();
    let mut out: String = chars.by_ref().take(EXCERPT_CHARS).collect();
    if chars.next().is_some() {
        out.push('…');
    }
    out
}

/// `id 7: ok: {...} [sha256:0123456789ab]`: the outcome, an excerpt, and a digest of it all.
fn summarize(id: u64, reply: &Value) -> String {
    let digest =
        Sha256Digest::of_json(reply.get("result").or(reply.get("error")).unwrap_or(reply)).to_hex();
    let short = &digest[..12.min(digest.len())];
    if let Some(error) = reply.get("error") {
        return format!(
            "id {id}: JSON-RPC error {}: {} [sha256:{short}]",
            error["code"],
            excerpt(&error["message"])
        );
    }
    let result = &reply["result"];
    let body = result
        .get("structuredContent")
        .or_else(|| result["content"].get(0).and_then(|c| c.get("text")))
        .unwrap_or(result);
    let outcome = if result["isError"] == Value::Bool(true) {
        "isError"
    } else {
        "ok"
    };
    format!("id {id}: {outcome}: {} [sha256:{short}]", excerpt(body))
}

impl Runner {
    async fn open(&self) -> Result<Connection, KitError> {
        Connection::open(&self.launcher, self.ids.clone(), self.timeout).await
    }

    /// Runs `f` with the observer on a blocking thread (observers do file or database I/O).
    async fn with_observer<T: Send + 'static>(
        &self,
        f: impl FnOnce(&dyn Observer) -> Result<T, crate::ObserveError> + Send + 'static,
    ) -> Result<T, KitError> {
        let observer = self.observer.clone();
        tokio::task::spawn_blocking(move || f(observer.as_ref()))
            .await
            .map_err(|e| KitError::Task {
                what: "the observer".to_owned(),
                message: e.to_string(),
            })?
            .map_err(KitError::from)
    }

    async fn observe(&self) -> Result<Observation, KitError> {
        self.with_observer(|o| o.observe()).await
    }

    /// The observer's copy of the state and the observation it copied, or `None` when the
    /// observer cannot restore.
    async fn save(&self) -> Result<Option<(Arc<SavedState>, Observation)>, KitError> {
        let Some(saved) = self.with_observer(|o| o.save()).await? else {
            return Ok(None);
        };
        let seen = self.observe().await?;
        Ok(Some((Arc::new(saved), seen)))
    }

    /// Puts the saved state back and checks that the observation has the saved content again.
    async fn restore(
        &self,
        (saved, seen): &(Arc<SavedState>, Observation),
        what: &str,
    ) -> Result<(), KitError> {
        let saved = saved.clone();
        self.with_observer(move |o| o.restore(&saved)).await?;
        let differences = seen.diff(&self.observe().await?).content_changes();
        if differences.is_empty() {
            Ok(())
        } else {
            Err(KitError::NotRestored {
                what: what.to_owned(),
                differences: differences.to_string(),
            })
        }
    }

    async fn run_tool(
        &self,
        fixtures: &ToolFixtures,
        claims: &Claims,
    ) -> Result<Vec<CaseReport>, KitError> {
        let tool = fixtures.name.as_str();
        let mut runs = Vec::new();
        let valid = self.single(tool, CaseKind::Valid, &fixtures.valid).await?;
        let baseline = valid.observed.first().map(|s| s.changes.clone());
        let mut repeat = self.single(tool, CaseKind::Repeat, &fixtures.valid).await?;
        repeat.outcomes.splice(0..0, valid.outcomes.iter().copied());
        repeat.second_call = Some(std::mem::replace(
            &mut repeat.first_call,
            format!("(case 'valid call') {}", valid.first_call),
        ));
        runs.push(valid);
        runs.push(repeat);
        if let Some(arguments) = &fixtures.missing_resource {
            runs.push(
                self.single(tool, CaseKind::MissingResource, arguments)
                    .await?,
            );
        }
        if let Some(arguments) = &fixtures.already_done {
            runs.push(self.single(tool, CaseKind::AlreadyDone, arguments).await?);
        }
        runs.push(
            self.single(tool, CaseKind::Invalid, &fixtures.invalid)
                .await?,
        );
        runs.push(
            self.retry_after_cut_off(tool, &fixtures.second_valid)
                .await?,
        );
        let (arguments, fresh) = match &fixtures.concurrent {
            Some(arguments) => (arguments, true),
            None => (&fixtures.valid, false),
        };
        runs.push(self.concurrent(tool, arguments, fresh).await?);
        if let Some(overwrite) = &fixtures.overwrite {
            runs.push(self.overwrite(tool, overwrite).await?);
        }
        Ok(runs
            .into_iter()
            .map(|run| judge(tool, claims, run, baseline.as_ref()))
            .collect())
    }

    /// One call on a fresh connection; observed from after the handshake to after the server
    /// ended (so work it finishes after replying is seen too).
    async fn single(
        &self,
        tool: &str,
        case: CaseKind,
        arguments: &Value,
    ) -> Result<CaseRun, KitError> {
        let mut connection = self.open().await?;
        let before = self.observe().await?;
        let (id, reply) = connection
            .request("tools/call", call_params(tool, arguments))
            .await?;
        connection.close().await?;
        let after = self.observe().await?;
        Ok(CaseRun {
            case,
            request: request_text(tool, arguments),
            first_call: summarize(id, &reply),
            second_call: None,
            observed: vec![step("call", &before, &after)],
            fresh: false,
            mid_flight: false,
            outcomes: vec![CallOutcome::of_reply(&reply)],
            ..CaseRun::default()
        })
    }

    /// Case 4: cut the connection after the server received the call, retry on a new one.
    async fn retry_after_cut_off(
        &self,
        tool: &str,
        arguments: &Value,
    ) -> Result<CaseRun, KitError> {
        let params = call_params(tool, arguments);
        let mut first = self.open().await?;
        let before = self.observe().await?;
        let id = first.send("tools/call", params.clone()).await?;
        let deadline = Instant::now() + self.timeout;
        let mut mid_flight = false;
        let mut first_outcome = CallOutcome::Interrupted;
        let first_call = match self.cut_off {
            CutOff::AfterResponse => {
                let reply = first.response(id).await?;
                first_outcome = CallOutcome::of_reply(&reply);
                format!(
                    "connection cut after the server wrote its response, which the client discarded unread (it was {})",
                    summarize(id, &reply)
                )
            }
            CutOff::WhenObserved => loop {
                let poll = (Instant::now() + OBSERVE_POLL).min(deadline);
                if let Some(reply) = first.response_until(id, poll).await? {
                    first_outcome = CallOutcome::of_reply(&reply);
                    break format!(
                        "connection cut when the response arrived before any change was observed (it was {})",
                        summarize(id, &reply)
                    );
                }
                if !before.diff(&self.observe().await?).is_empty() {
                    mid_flight = true;
                    break format!(
                        "id {id}: connection cut as soon as the state changed, before any response"
                    );
                }
                if Instant::now() >= deadline {
                    return Err(KitError::Timeout {
                        what: format!("a state change or the reply to id {id}"),
                        after: self.timeout,
                        stderr: first.stderr(),
                    });
                }
            },
        };
        first.close().await?;
        let cut = self.observe().await?;
        let mut second = self.open().await?;
        let restarted = self.observe().await?;
        let (retry_id, reply) = second.request("tools/call", params).await?;
        second.close().await?;
        let after = self.observe().await?;
        Ok(CaseRun {
            case: CaseKind::RetryAfterCutOff,
            request: request_text(tool, arguments),
            first_call,
            second_call: Some(format!(
                "retry on a new connection, {}",
                summarize(retry_id, &reply)
            )),
            observed: vec![
                step("cut-off call", &before, &cut),
                step("retry", &restarted, &after),
            ],
            fresh: false,
            mid_flight,
            outcomes: vec![first_outcome, CallOutcome::of_reply(&reply)],
            ..CaseRun::default()
        })
    }

    /// Case 5: the same call on two connections at the same instant, compared with one call
    /// from the same starting state when the observer can restore it, and with two calls one
    /// after the other from that state (which tells a lost update from an idempotent operation).
    async fn concurrent(
        &self,
        tool: &str,
        arguments: &Value,
        fresh: bool,
    ) -> Result<CaseRun, KitError> {
        let params = call_params(tool, arguments);
        let mut observed = Vec::new();
        let mut notes = Vec::new();
        // One call alone, twice, each time with the state put back afterwards: what the pair's
        // outcome must equal, and which records differ from one execution to the next anyway.
        let mut single = None;
        let mut in_a_row = None;
        if let Some(saved) = self.save().await? {
            let mut outcomes = Vec::new();
            for run in ["first", "second"] {
                let mut one = self.open().await?;
                let start = self.observe().await?;
                let (id, reply) = one.request("tools/call", params.clone()).await?;
                one.close().await?;
                let after_one = self.observe().await?;
                self.restore(&saved, "the concurrent pair's single calls")
                    .await?;
                if run == "first" {
                    observed.push(step("one call", &start, &after_one));
                    notes.push(format!(
                        "for comparison, one call from the same starting state, made twice with the state restored after each: {}",
                        summarize(id, &reply)
                    ));
                }
                outcomes.push(after_one);
            }
            // Two calls one after the other, each on its own connection: what two updates leave
            // when neither can lose the other's.
            let start = self.observe().await?;
            let mut both_ok = true;
            for _ in 0..2 {
                let mut one = self.open().await?;
                let (_, reply) = one.request("tools/call", params.clone()).await?;
                one.close().await?;
                both_ok &= CallOutcome::of_reply(&reply) == CallOutcome::Ok;
            }
            let after_two = self.observe().await?;
            self.restore(&saved, "the concurrent pair's calls one after the other")
                .await?;
            observed.push(step("two calls one after the other", &start, &after_two));
            let again = outcomes.pop();
            let one = outcomes.pop();
            single = one
                .zip(again)
                .map(|(one, again)| (saved.1.clone(), one, again));
            in_a_row = Some((after_two, both_ok));
        } else {
            notes.push("the observer cannot restore state (Observer::save and Observer::restore), so the pair is compared with case 'valid call' by the number of changed records only".to_owned());
        }
        let mut a = self.open().await?;
        let mut b = self.open().await?;
        let before = self.observe().await?;
        let id_a = a.send("tools/call", params.clone()).await?;
        let id_b = b.send("tools/call", params).await?;
        let (reply_a, reply_b) = tokio::join!(a.response(id_a), b.response(id_b));
        let (reply_a, reply_b) = (reply_a?, reply_b?);
        let (closed_a, closed_b) = tokio::join!(a.close(), b.close());
        closed_a?;
        closed_b?;
        let after = self.observe().await?;
        observed.push(step("both calls", &before, &after));
        let mut sequential = None;
        let compared = single.map(|(start, one, again)| {
            if let Some((after_two, both_ok)) = &in_a_row {
                sequential = Some(Sequential {
                    difference: outcome_difference(&start, &one, &again, after_two).0,
                    both_ok: *both_ok,
                });
            }
            let (difference, shaped) = outcome_difference(&start, &one, &again, &after);
            if !shaped.is_empty() {
                notes.push(format!(
                    "two single calls left different content in {} (it differs per execution), so there the pair is compared by the kind of change and the lines added",
                    shaped.join(", ")
                ));
            }
            difference
        });
        Ok(CaseRun {
            case: CaseKind::Concurrent,
            request: request_text(tool, arguments),
            first_call: summarize(id_a, &reply_a),
            second_call: Some(summarize(id_b, &reply_b)),
            observed,
            fresh,
            compared,
            notes,
            outcomes: vec![
                CallOutcome::of_reply(&reply_a),
                CallOutcome::of_reply(&reply_b),
            ],
            sequential,
            ..CaseRun::default()
        })
    }

    /// Case 6: seed existing state, call the tool to modify it, put the state back.
    async fn overwrite(&self, tool: &str, overwrite: &Overwrite) -> Result<CaseRun, KitError> {
        let saved = self.save().await?;
        let unseeded = self.observe().await?;
        let mut notes = vec![format!("seed: {}", overwrite.seed.describe())];
        match &overwrite.seed {
            Seed::Record { name, content } => {
                let (name, content) = (name.clone(), content.clone());
                self.with_observer(move |o| o.seed(&name, &content)).await?;
            }
            Seed::Call {
                tool: seed_tool,
                arguments,
            } => {
                let mut connection = self.open().await?;
                let (id, reply) = connection
                    .request("tools/call", call_params(seed_tool, arguments))
                    .await?;
                connection.close().await?;
                let failed =
                    reply.get("error").is_some() || reply["result"]["isError"] == Value::Bool(true);
                if failed {
                    return Err(KitError::Seed {
                        tool: tool.to_owned(),
                        message: format!(
                            "the preparatory call {} failed ({}); fix its arguments so that it succeeds on the state the matrix left",
                            request_text(seed_tool, arguments),
                            summarize(id, &reply)
                        ),
                    });
                }
                notes[0].push_str(&format!(" ({})", summarize(id, &reply)));
            }
        }
        let seeded = self.observe().await?;
        let seed_step = step("seed (not judged)", &unseeded, &seeded);
        let mut targets: Vec<String> = seed_step
            .changes
            .content_changes()
            .changes
            .iter()
            .map(|c| c.item.clone())
            .collect();
        if let Seed::Record { name, .. } = &overwrite.seed {
            if !seeded.items.contains_key(name) {
                return Err(KitError::Seed {
                    tool: tool.to_owned(),
                    message: format!(
                        "after writing the record `{name}` the observation has no record of that name; name it as the observer does (FsObserver: `<root directory name>/<relative path>`)"
                    ),
                });
            }
            if !targets.contains(name) {
                targets.push(name.clone());
            }
        }
        let mut connection = self.open().await?;
        let before = self.observe().await?;
        let (id, reply) = connection
            .request("tools/call", call_params(tool, &overwrite.arguments))
            .await?;
        connection.close().await?;
        let after = self.observe().await?;
        let call = step("call", &before, &after);
        let hit: Vec<String> = call
            .changes
            .content_changes()
            .changes
            .iter()
            .filter(|c| targets.contains(&c.item))
            .map(|c| format!("{} {}", c.kind.as_str(), c.item))
            .collect();
        notes.push(if hit.is_empty() {
            "the call left the seeded state's content as it was".to_owned()
        } else {
            format!("the call changed the seeded state ({})", hit.join(", "))
        });
        match &saved {
            Some(saved) => {
                self.restore(saved, "the overwrite case's seed").await?;
                notes.push("the state was then restored to what it was before the seed".to_owned());
            }
            None => notes.push("the observer cannot restore state, so the seeded state and the call's changes stay".to_owned()),
        }
        Ok(CaseRun {
            case: CaseKind::Overwrite,
            request: request_text(tool, &overwrite.arguments),
            first_call: summarize(id, &reply),
            second_call: None,
            context: vec![seed_step],
            observed: vec![call],
            notes,
            outcomes: vec![CallOutcome::of_reply(&reply)],
            ..CaseRun::default()
        })
    }
}
