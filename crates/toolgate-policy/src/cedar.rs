//! Cedar policies checked against the tools they govern (feature `cedar`).
//!
//! toolgate generates a Cedar schema from the tools' input schemas (the ones `toolgate.lock`
//! holds), so a Cedar policy that names an argument a tool does not have, compares a string with
//! a number or names a tool that does not exist is refused when it is loaded, naming the policy
//! and its line, instead of silently never matching. The entity model, in the namespace
//! `Toolgate`:
//!
//! - principal `Toolgate::Caller`: the verified caller, with `channel` (`stdio`, `http`),
//!   `scopes` (a set of strings) and, when its credential names one, `tenant`; a member of
//!   `Toolgate::Role` entities (`principal in Toolgate::Role::"admin"`);
//! - resource `Toolgate::Tool`: the tool, with `read_only`, `destructive`, `idempotent` and
//!   `open_world` (its annotations, the spec's defaults when absent), `tags` (the set the JSON
//!   policy's `tags` gives it, empty when none) and, when the policy declares one, `effect` (its
//!   effect class);
//! - actions: `Toolgate::Action::"tools/list"` (listing a tool: no arguments are known) and one
//!   action per tool, named by the tool (`Toolgate::Action::"delete_booking"`), each a member of
//!   `Toolgate::Action::"tools/call"`; a call's context is `{arguments, now}`: the arguments typed
//!   from the tool's input schema (`context.arguments.amount`; a property the schema does not
//!   require is optional, so a policy tests it with `has` first) and `now`, the time of the call
//!   in seconds since the Unix epoch.
//!
//! JSON Schema types map to Cedar's: `string` (and a string `enum`) to `String`, `integer` to
//! `Long`, `boolean` to `Bool`, `array` to `Set` of its items, `object` to a `Record` of its
//! properties, `$ref` to what it names in the schema's `$defs` / `definitions`, a type list with
//! `null` to the other type. What has no Cedar type (`number`, unions, a schema without a type)
//! is left out of the context, so a policy that reads it is refused as naming an attribute that
//! does not exist.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::str::FromStr as _;
use std::sync::Arc;

use cedar_policy::RestrictedExpression;
use serde_json::{Map, Value, json};
use toolgate_canon::Sha256Digest;

pub use crate::{CedarSource, MAX_CEDAR_FILE_BYTES, ToolSignature};

/// The Cedar namespace of toolgate's entity types and actions.
pub const NAMESPACE: &str = "Toolgate";
/// The action of listing a tool.
pub const LIST_ACTION: &str = "tools/list";
/// The action group every tool's call action belongs to.
pub const CALL_ACTION: &str = "tools/call";

/// How deep `$ref`s and nested objects are followed when typing a tool's arguments; deeper parts
/// are left out of the context.
const MAX_DEPTH: usize = 16;

/// The Cedar schema (JSON form) of toolgate's entity model for `tools`; see the module
/// documentation. `toolgate-server policy schema` prints it for editors.
pub fn cedar_schema(tools: &[ToolSignature]) -> Value {
    let caller = json!({
        "memberOfTypes": ["Role"],
        "tags": {"type": "String"},
        "shape": {"type": "Record", "attributes": {
            "name": {"type": "String"},
            "channel": {"type": "String"},
            "scopes": {"type": "Set", "element": {"type": "String"}},
            "tenant": {"type": "String", "required": false},
        }},
    });
    let tool = json!({
        "shape": {"type": "Record", "attributes": {
            "read_only": {"type": "Boolean"},
            "destructive": {"type": "Boolean"},
            "idempotent": {"type": "Boolean"},
            "open_world": {"type": "Boolean"},
            "effect": {"type": "String", "required": false},
            "tags": {"type": "Set", "element": {"type": "String"}},
        }},
    });
    let applies = |context: Value| json!({"principalTypes": ["Caller"], "resourceTypes": ["Tool"], "context": context});
    let mut actions = Map::new();
    actions.insert(
        LIST_ACTION.to_owned(),
        json!({"appliesTo": applies(json!({"type": "Record", "attributes": {}}))}),
    );
    actions.insert(CALL_ACTION.to_owned(), json!({}));
    for tool in tools {
        let arguments = record(&tool.input_schema, &tool.input_schema, 0);
        let context = json!({"type": "Record", "attributes": {
            "arguments": arguments,
            "now": {"type": "Long"},
            "client": {"type": "String", "required": false},
        }});
        actions.insert(
            tool.name.clone(),
            json!({"memberOf": [{"id": CALL_ACTION}], "appliesTo": applies(context)}),
        );
    }
    json!({NAMESPACE: {
        "entityTypes": {"Caller": caller, "Role": {}, "Tool": tool},
        "actions": actions,
    }})
}

/// The Cedar type of the JSON Schema `schema` (inside the tool schema `root`), if it has one.
fn cedar_type(root: &Value, schema: &Value, depth: usize) -> Option<Value> {
    if depth > MAX_DEPTH {
        return None;
    }
    if let Some(reference) = schema.get("$ref").and_then(Value::as_str) {
        let target = reference
            .strip_prefix("#/$defs/")
            .map(|name| ("$defs", name))
            .or_else(|| {
                reference
                    .strip_prefix("#/definitions/")
                    .map(|name| ("definitions", name))
            })
            .and_then(|(section, name)| root.get(section)?.get(name))?;
        return cedar_type(root, target, depth + 1);
    }
    let kind = match schema.get("type") {
        Some(Value::String(kind)) => kind.as_str(),
        // `["integer", "null"]`: the non-null type (a null argument is left out of the context).
        Some(Value::Array(kinds)) => {
            let mut others = kinds
                .iter()
                .filter_map(Value::as_str)
                .filter(|k| *k != "null");
            match (others.next(), others.next()) {
                (Some(kind), None) => kind,
                _ => return None,
            }
        }
        _ if schema
            .get("enum")
            .and_then(Value::as_array)
            .is_some_and(|values| !values.is_empty() && values.iter().all(Value::is_string)) =>
        {
            "string"
        }
        _ => return None,
    };
    Some(match kind {
        "string" => json!({"type": "String"}),
        "integer" => json!({"type": "Long"}),
        "boolean" => json!({"type": "Boolean"}),
        "array" => {
            let items = schema.get("items")?;
            json!({"type": "Set", "element": cedar_type(root, items, depth + 1)?})
        }
        "object" => record(root, schema, depth + 1),
        _ => return None,
    })
}

/// The Cedar record of the JSON Schema object `schema`: its typed properties, each optional
/// unless `required`.
fn record(root: &Value, schema: &Value, depth: usize) -> Value {
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|names| names.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut attributes = Map::new();
    if let Some(properties) = schema.get("properties").and_then(Value::as_object) {
        for (name, property) in properties {
            if let Some(mut kind) = cedar_type(root, property, depth + 1) {
                if !required.contains(&name.as_str()) {
                    kind["required"] = Value::Bool(false);
                }
                attributes.insert(name.clone(), kind);
            }
        }
    }
    json!({"type": "Record", "attributes": attributes})
}

/// One reason a Cedar policy was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CedarProblem {
    /// The policy: its `@id("...")` annotation, else Cedar's positional id (`policy0`, ...).
    pub policy: String,
    /// The line of the file the problem is on, when Cedar points at one.
    pub line: Option<usize>,
    /// What is wrong.
    pub message: String,
}

impl std::fmt::Display for CedarProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.line {
            Some(line) => write!(f, "policy {} (line {line}): {}", self.policy, self.message),
            None => write!(f, "policy {}: {}", self.policy, self.message),
        }
    }
}

/// Why a Cedar policy set could not be loaded. Nothing was loaded; each message names the file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CedarError {
    /// The file could not be read.
    #[error("cannot read the Cedar policies {}: {cause}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// What reading it said.
        cause: std::io::Error,
    },
    /// The text is not Cedar.
    #[error("{source_name}: not valid Cedar: {}", join(.problems))]
    Syntax {
        /// The file (or what the text was given as).
        source_name: String,
        /// Each syntax error, with its line.
        problems: Vec<CedarProblem>,
    },
    /// Policies that do not hold for the tools they govern (Cedar's strict validation against
    /// the schema of [`cedar_schema`]).
    #[error(
        "{source_name}: the Cedar policies do not fit the tools ({} problem{}): {}; fix each (the entity model is in docs/policy.md)",
        problems.len(),
        if problems.len() == 1 { "" } else { "s" },
        join(.problems)
    )]
    Invalid {
        /// The file (or what the text was given as).
        source_name: String,
        /// Every problem found, in the order of the file.
        problems: Vec<CedarProblem>,
    },
    /// The schema generated from the tools was refused by Cedar (a tool name Cedar cannot take).
    #[error("cannot build the Cedar schema of the tools: {0}")]
    Schema(String),
}

fn join(problems: &[CedarProblem]) -> String {
    problems
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// A Cedar policy set validated against the tools it governs, ready to decide requests.
#[derive(Debug, Clone)]
pub struct CedarPolicies {
    policies: cedar_policy::PolicySet,
    schema: cedar_policy::Schema,
    digest: Sha256Digest,
    /// Each tool's call action and the Cedar type of its arguments (to build a call's context).
    tools: HashMap<String, ToolAction>,
    list_action: cedar_policy::EntityUid,
    call_group: cedar_policy::EntityUid,
    /// The policies whose action scope admits `tools/list`.
    listing: cedar_policy::PolicySet,
    /// Each policy's name (its `@id`, else its positional id): Cedar parses the annotation key
    /// on every lookup, which costs microseconds per determining policy.
    names: HashMap<cedar_policy::PolicyId, String>,
    /// The entities of recent requests ([`CedarPolicies::entities`]).
    entity_cache: Arc<std::sync::Mutex<EntityCache>>,
}

/// The entities of one caller's requests about one tool, the policies that can apply to them,
/// and the listing decided with them.
#[derive(Debug)]
struct CachedEntities {
    entities: cedar_policy::Entities,
    /// The tool's policies whose principal scope admits this caller, split by what the call's
    /// context can change.
    call: SplitPolicies,
    /// The `tools/list` policies whose principal scope admits this caller.
    list_policies: cedar_policy::PolicySet,
    listing: std::sync::OnceLock<CedarAnswer>,
    /// The caller's uid (parsing its type name costs Cedar microseconds).
    principal: cedar_policy::EntityUid,
}

impl CachedEntities {
    /// The request of this caller for `action` on `tool`, with `context`. Not validated against
    /// the schema again: the caller, tool and action are the set's own, and a call's context is
    /// built from the schema's types (`project_record`); a request that did not fit would make a
    /// policy err, and any error denies.
    fn request(
        &self,
        action: &cedar_policy::EntityUid,
        tool: &ToolAction,
        context: cedar_policy::Context,
    ) -> Result<cedar_policy::Request, CedarAnswer> {
        cedar_policy::Request::new(
            self.principal.clone(),
            action.clone(),
            tool.resource.uid(),
            context,
            None,
        )
        .map_err(|error| CedarAnswer::denied(error.to_string()))
    }
}

/// How many callers' entities a policy set keeps; the cache starts over when it is full.
const ENTITY_CACHE_ENTRIES: usize = 4096;

/// The cached entities by the hash of their key ([`EntityKey::hash_of`]), each hash's entries
/// told apart by their whole key: a lookup builds no owned key.
type EntityCache = HashMap<u64, Vec<(EntityKey, Arc<CachedEntities>)>>;

/// Everything the entities of one request are made of.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct EntityKey {
    tool: cedar_policy::EntityUid,
    id: String,
    name: String,
    channel: String,
    tenant: Option<String>,
    scopes: BTreeSet<String>,
    roles: BTreeSet<String>,
    attributes: BTreeMap<String, String>,
}

impl EntityKey {
    fn of(tool: &cedar_policy::EntityUid, caller: &CedarCaller<'_>) -> Self {
        EntityKey {
            tool: tool.clone(),
            id: caller.id.to_owned(),
            name: caller.name.to_owned(),
            channel: caller.channel.to_owned(),
            tenant: caller.tenant.map(str::to_owned),
            scopes: caller.scopes.clone(),
            roles: caller.roles.clone(),
            attributes: caller.attributes.clone(),
        }
    }

    /// Whether this is the key of `caller`'s requests about `tool`.
    fn is(&self, tool: &cedar_policy::EntityUid, caller: &CedarCaller<'_>) -> bool {
        self.tool == *tool
            && self.id == caller.id
            && self.name == caller.name
            && self.channel == caller.channel
            && self.tenant.as_deref() == caller.tenant
            && self.scopes == *caller.scopes
            && self.roles == *caller.roles
            && self.attributes == *caller.attributes
    }

    /// The hash of the key of `caller`'s requests about `tool`, from the borrowed parts.
    fn hash_of(tool: &cedar_policy::EntityUid, caller: &CedarCaller<'_>) -> u64 {
        use std::hash::{Hash as _, Hasher as _};
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        tool.hash(&mut hasher);
        caller.id.hash(&mut hasher);
        caller.name.hash(&mut hasher);
        caller.channel.hash(&mut hasher);
        caller.tenant.hash(&mut hasher);
        caller.scopes.hash(&mut hasher);
        caller.roles.hash(&mut hasher);
        caller.attributes.hash(&mut hasher);
        hasher.finish()
    }
}

#[derive(Debug, Clone)]
struct ToolAction {
    uid: cedar_policy::EntityUid,
    /// The policies whose action scope admits a call of this tool: Cedar's decision over them is
    /// its decision over the whole set (every other policy's scope is false for the request), at
    /// a fraction of the work when a set governs many tools.
    policies: cedar_policy::PolicySet,
    /// The Cedar record type (JSON form) of the arguments.
    arguments: Value,
    /// The resource `Toolgate::Tool` with its attributes.
    resource: cedar_policy::Entity,
}

/// Runs `decide` with the caller `id` as Cedar sees it: what its credential says (none for a
/// configured stdio principal: its id as name, channel `stdio`, no scopes, tenant, roles or
/// attributes), with the roles and attributes entity data gives it (`extra`: roles joined; a
/// credential's attribute wins over the entity data's).
pub fn as_caller<R>(
    id: &str,
    credential: Option<&crate::credential::VerifiedPrincipal>,
    extra: Option<(&BTreeSet<String>, &BTreeMap<String, String>)>,
    decide: impl FnOnce(&CedarCaller<'_>) -> R,
) -> R {
    static NONE: BTreeSet<String> = BTreeSet::new();
    static NO_ATTRIBUTES: BTreeMap<String, String> = BTreeMap::new();
    let mut roles = std::borrow::Cow::Borrowed(credential.map_or(&NONE, |c| c.roles()));
    let mut attributes =
        std::borrow::Cow::Borrowed(credential.map_or(&NO_ATTRIBUTES, |c| c.attributes()));
    if let Some((extra_roles, extra_attributes)) = extra {
        roles.to_mut().extend(extra_roles.iter().cloned());
        for (key, value) in extra_attributes {
            attributes
                .to_mut()
                .entry(key.clone())
                .or_insert_with(|| value.clone());
        }
    }
    decide(&CedarCaller {
        id,
        name: credential.map_or(id, |c| c.name()),
        channel: credential.and_then(|c| c.channel()).unwrap_or("stdio"),
        scopes: credential.and_then(|c| c.scopes()).unwrap_or(&NONE),
        tenant: credential.and_then(|c| c.tenant()),
        roles: &roles,
        attributes: &attributes,
    })
}

/// Who calls, as Cedar sees it (the principal `Toolgate::Caller`).
#[derive(Debug, Clone, Copy)]
pub struct CedarCaller<'a> {
    /// The entity id: the caller's identity key (`name`, `TENANT/name`, `ISSUER#TENANT/name`).
    pub id: &'a str,
    /// The name within its authority and tenant (attribute `name`).
    pub name: &'a str,
    /// How it came in: `stdio` or `http` (attribute `channel`).
    pub channel: &'a str,
    /// The scopes its credential holds (attribute `scopes`; empty for an unscoped credential).
    pub scopes: &'a BTreeSet<String>,
    /// Its tenant, when its credential names one (attribute `tenant`).
    pub tenant: Option<&'a str>,
    /// The roles it is a member of (`principal in Toolgate::Role::"admin"`).
    pub roles: &'a BTreeSet<String>,
    /// The other attributes its credential carries (an API token's `--attr`, the JWT claims an
    /// operator maps), as the entity's tags: `principal.hasTag("dept") &&
    /// principal.getTag("dept") == "sales"`.
    pub attributes: &'a BTreeMap<String, String>,
}

/// What Cedar decided, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CedarAnswer {
    /// Whether the request is permitted.
    pub allowed: bool,
    /// The policies that determined the decision (their `@id`, else Cedar's positional id),
    /// sorted: the `permit`s that matched for an allowed request, the `forbid`s that matched for
    /// a denied one (none when no `permit` matched). Shared: an answer is copied into the
    /// audit record and the refusal without copying the names.
    pub determining: Arc<[String]>,
    /// What went wrong while deciding, if anything. Any error denies (see [`CedarPolicies`]).
    pub errors: Vec<String>,
}

impl CedarAnswer {
    /// Why a call was not permitted, for the caller: the determining `forbid`s, or that no
    /// `permit` matched, or that the policies could not decide (never the errors' text, which
    /// can quote argument values).
    pub fn why_not(&self) -> String {
        if !self.errors.is_empty() {
            "the Cedar policies could not decide it (the server's log says why)".to_owned()
        } else if self.determining.is_empty() {
            "no Cedar policy permits it with these arguments".to_owned()
        } else {
            format!(
                "forbidden by the Cedar policies {}",
                self.determining.join(", ")
            )
        }
    }

    fn denied(error: String) -> Self {
        CedarAnswer {
            allowed: false,
            determining: Arc::default(),
            errors: vec![error],
        }
    }
}

impl CedarPolicies {
    /// Reads the Cedar policies at `path` (at most [`MAX_CEDAR_FILE_BYTES`]) and validates them
    /// against `tools` ([`CedarPolicies::from_text`]); errors name the file.
    pub fn load(path: &Path, tools: &[ToolSignature]) -> Result<Self, CedarError> {
        let text =
            crate::read_text(path, MAX_CEDAR_FILE_BYTES).map_err(|cause| CedarError::Read {
                path: path.to_owned(),
                cause,
            })?;
        Self::from_text(&text, &path.display().to_string(), tools)
    }

    /// The policies a JSON policy names ([`crate::Policy::cedar`]), validated against `tools`.
    pub fn from_source(source: &CedarSource, tools: &[ToolSignature]) -> Result<Self, CedarError> {
        Self::from_text(source.text(), &source.path().display().to_string(), tools)
    }

    /// Parses `text` (named `source_name` in errors) and validates every policy with Cedar's
    /// strict validator against the schema of `tools`: all problems are reported together, each
    /// with its policy and line.
    pub fn from_text(
        text: &str,
        source_name: &str,
        tools: &[ToolSignature],
    ) -> Result<Self, CedarError> {
        let schema = cedar_policy::Schema::from_json_value(cedar_schema(tools))
            .map_err(|error| CedarError::Schema(error.to_string()))?;
        let policies = parse(text, source_name)?;
        let validator = cedar_policy::Validator::new(schema.clone());
        let result = validator.validate(&policies, cedar_policy::ValidationMode::Strict);
        let mut problems: Vec<CedarProblem> = result
            .validation_errors()
            .map(|error| CedarProblem {
                policy: policy_name(&policies, error.policy_id()),
                line: first_line(text, error),
                // Cedar names the policy by its positional id; the problem names it already.
                message: error
                    .to_string()
                    .trim_start_matches(&format!("for policy `{}`, ", error.policy_id()))
                    .to_owned(),
            })
            .collect();
        if !problems.is_empty() {
            problems.sort_by_key(|problem| problem.line);
            return Err(CedarError::Invalid {
                source_name: source_name.to_owned(),
                problems,
            });
        }
        let action = |id: &str| action_uid(id).map_err(CedarError::Schema);
        let list_action = action(LIST_ACTION)?;
        let call_group = action(CALL_ACTION)?;
        let mut actions = HashMap::with_capacity(tools.len());
        for tool in tools {
            let uid = action(&tool.name)?;
            actions.insert(tool.name.clone(), {
                let resource = resource(tool).map_err(CedarError::Schema)?;
                ToolAction {
                    policies: scoped(&policies, &uid, Some(&call_group), Some(&resource.uid()))?,
                    uid,
                    arguments: record(&tool.input_schema, &tool.input_schema, 0),
                    resource,
                }
            });
        }
        let names = policies
            .policies()
            .map(|policy| (policy.id().clone(), policy_name(&policies, policy.id())))
            .collect();
        Ok(CedarPolicies {
            listing: scoped(&policies, &list_action, None, None)?,
            names,
            policies,
            schema,
            digest: Sha256Digest::of(text.as_bytes()),
            tools: actions,
            list_action,
            call_group,
            entity_cache: Arc::default(),
        })
    }

    /// The SHA-256 of the policy text.
    pub fn digest(&self) -> Sha256Digest {
        self.digest
    }

    /// How many policies the set holds.
    pub fn len(&self) -> usize {
        self.policies.policies().count()
    }

    /// Whether the set holds no policy.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The ids of the policies (their `@id` annotation, else Cedar's positional id), sorted.
    pub fn ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self.names.values().cloned().collect();
        ids.sort();
        ids
    }

    /// The name of the policy `id`.
    fn name(&self, id: &cedar_policy::PolicyId) -> String {
        self.names
            .get(id)
            .cloned()
            .unwrap_or_else(|| id.to_string())
    }

    /// The schema the policies were validated against.
    pub fn schema(&self) -> &cedar_policy::Schema {
        &self.schema
    }

    /// What this set decides for `caller` about `tool`: its listing and its calls (see
    /// [`CedarView`]). Denied (the answer is the error) when the set was not validated against a
    /// tool `tool`, or the caller cannot be made a Cedar entity.
    pub fn view<'a>(
        &'a self,
        caller: &CedarCaller<'_>,
        tool: &str,
    ) -> Result<CedarView<'a>, CedarAnswer> {
        let Some(action) = self.tools.get(tool) else {
            return Err(CedarAnswer::denied(format!(
                "the Cedar policies were not checked against a tool `{tool}`"
            )));
        };
        let cached = self.entities(caller, action).map_err(CedarAnswer::denied)?;
        Ok(CedarView {
            set: self,
            action,
            cached,
        })
    }

    /// Whether `caller` may call `tool` with `arguments` at `now`: [`CedarView::call`].
    pub fn authorize_call(
        &self,
        caller: &CedarCaller<'_>,
        tool: &str,
        arguments: Option<&Map<String, Value>>,
        now: i64,
        client: Option<&str>,
    ) -> CedarAnswer {
        self.view(caller, tool)
            .map_or_else(|denied| denied, |view| view.call(arguments, now, client))
    }

    /// Whether tools/list shows `tool` to `caller`: [`CedarView::listing`].
    pub fn authorize_listing(&self, caller: &CedarCaller<'_>, tool: &str) -> CedarAnswer {
        self.view(caller, tool)
            .map_or_else(|denied| denied, |view| view.listing())
    }

    fn listing(&self, cached: &CachedEntities, action: &ToolAction) -> CedarAnswer {
        let listed = self.decide_listing(cached, action);
        if !listed.allowed {
            return listed;
        }
        if let Some(denied) = &cached.call.denied {
            return denied.clone();
        }
        listed
    }

    /// The entities of a request of `caller` about `tool`: the caller (with its roles and
    /// attributes), the tool, its call action with the `tools/call` group, and `tools/list`
    /// (one set serves the listing and the call). Building them costs Cedar several microseconds
    /// (attribute values, the transitive closure), and a caller asks about the same tools over and
    /// over, so they are kept, keyed by everything they are made of, in a bounded cache that lives
    /// as long as this policy set.
    fn entities(
        &self,
        caller: &CedarCaller<'_>,
        tool: &ToolAction,
    ) -> Result<Arc<CachedEntities>, String> {
        use cedar_policy::Entity;
        let hash = EntityKey::hash_of(&tool.uid, caller);
        if let Some((_, entities)) = self
            .cache()
            .get(&hash)
            .and_then(|entries| entries.iter().find(|(key, _)| key.is(&tool.uid, caller)))
        {
            return Ok(Arc::clone(entities));
        }
        let principal = entity_uid("Caller", caller.id)?;
        let mut roles = HashSet::with_capacity(caller.roles.len());
        for role in caller.roles {
            roles.insert(entity_uid("Role", role)?);
        }
        let string = |text: &str| RestrictedExpression::new_string(text.to_owned());
        let mut attributes = HashMap::from([
            ("name".to_owned(), string(caller.name)),
            ("channel".to_owned(), string(caller.channel)),
            (
                "scopes".to_owned(),
                RestrictedExpression::new_set(caller.scopes.iter().map(|scope| string(scope))),
            ),
        ]);
        if let Some(tenant) = caller.tenant {
            attributes.insert("tenant".to_owned(), string(tenant));
        }
        let tags = caller
            .attributes
            .iter()
            .map(|(key, value)| (key.clone(), string(value)));
        let role_uids = roles.clone();
        let mut entities = Vec::with_capacity(5 + roles.len());
        entities.extend(
            roles
                .iter()
                .map(|role| Entity::new_no_attrs(role.clone(), HashSet::new())),
        );
        entities.push(
            Entity::new_with_tags(principal.clone(), attributes, roles, tags)
                .map_err(|e| e.to_string())?,
        );
        entities.push(tool.resource.clone());
        entities.push(Entity::new_no_attrs(
            self.list_action.clone(),
            HashSet::new(),
        ));
        entities.push(Entity::new_no_attrs(
            tool.uid.clone(),
            HashSet::from([self.call_group.clone()]),
        ));
        entities.push(Entity::new_no_attrs(
            self.call_group.clone(),
            HashSet::new(),
        ));
        let entities =
            cedar_policy::Entities::from_entities(entities, None).map_err(|e| e.to_string())?;
        // The call with its context unknown.
        let call = cedar_policy::RequestBuilder::default()
            .principal(principal.clone())
            .action(tool.uid.clone())
            .resource(tool.resource.uid())
            .build();
        let entities = Arc::new(CachedEntities {
            call: SplitPolicies::new(
                &for_caller(&tool.policies, &principal, &role_uids)?,
                &call,
                &entities,
                |id| self.name(id),
            )?,
            entities,
            list_policies: for_caller(&self.listing, &principal, &role_uids)?,
            listing: std::sync::OnceLock::new(),
            principal: principal.clone(),
        });
        let mut cache = self.cache();
        if cache.len() >= ENTITY_CACHE_ENTRIES {
            cache.clear();
        }
        cache
            .entry(hash)
            .or_default()
            .push((EntityKey::of(&tool.uid, caller), Arc::clone(&entities)));
        Ok(entities)
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, EntityCache> {
        // A map of immutable values stays consistent even if a holder panicked.
        self.entity_cache
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Cedar's decision for listing `tool` to `caller`; an error anywhere denies.
    fn decide_listing(&self, cached: &CachedEntities, tool: &ToolAction) -> CedarAnswer {
        let request = match cached.request(&self.list_action, tool, cedar_policy::Context::empty())
        {
            Ok(request) => request,
            Err(denied) => return denied,
        };
        let (mut answer, allowed) = self.evaluate(&request, &cached.list_policies, cached);
        answer.allowed = allowed && answer.errors.is_empty();
        answer
    }

    /// Cedar's answer over `policies`, and whether Cedar's decision was Allow (which
    /// [`CedarAnswer::allowed`] is not yet: it is left false for the caller to set, since an
    /// error denies).
    fn evaluate(
        &self,
        request: &cedar_policy::Request,
        policies: &cedar_policy::PolicySet,
        cached: &CachedEntities,
    ) -> (CedarAnswer, bool) {
        let response =
            cedar_policy::Authorizer::new().is_authorized(request, policies, &cached.entities);
        let errors: Vec<String> = response
            .diagnostics()
            .errors()
            .map(ToString::to_string)
            .collect();
        let mut determining: Vec<String> = response
            .diagnostics()
            .reason()
            .map(|id| self.name(id))
            .collect();
        determining.sort();
        let allowed = response.decision() == cedar_policy::Decision::Allow;
        (
            CedarAnswer {
                allowed: false,
                determining: determining.into(),
                errors,
            },
            allowed,
        )
    }
}

/// What a [`CedarPolicies`] decides for one caller about one tool: its listing and its calls.
/// Made by [`CedarPolicies::view`] from the entities the set keeps for that caller and tool, so
/// a gate that checks the listing and then the call of one request looks them up once.
#[derive(Debug, Clone)]
pub struct CedarView<'a> {
    set: &'a CedarPolicies,
    action: &'a ToolAction,
    cached: Arc<CachedEntities>,
}

impl CedarView<'_> {
    /// Whether the caller may call the tool with `arguments` at `now` (seconds since the Unix
    /// epoch), the client having declared the name `client`: Cedar's decision for the tool's
    /// call action, with the context `{arguments, now, client}`. The arguments are given to
    /// Cedar as the tool's schema types them: members the schema does not declare (or cannot
    /// type) are left out, and a value that does not fit its type denies the call (the gate
    /// checks arguments against the input schema first, so that is rare). Any request during
    /// whose evaluation a policy errs is denied: a `forbid` that could not be evaluated must not
    /// let a call through.
    pub fn call(
        &self,
        arguments: Option<&Map<String, Value>>,
        now: i64,
        client: Option<&str>,
    ) -> CedarAnswer {
        let (action, cached) = (self.action, &self.cached);
        let empty = Map::new();
        let arguments = match project_record(arguments.unwrap_or(&empty), &action.arguments) {
            Ok(arguments) => arguments,
            Err(error) => {
                return CedarAnswer::denied(format!(
                    "the arguments cannot be given to Cedar: {error}"
                ));
            }
        };
        if cached.call.open.is_empty() {
            // Every policy that can apply is satisfied outright or not at all: the context
            // (arguments, time, client) cannot change the answer.
            return cached.call.answer(None, false);
        }
        let mut context = vec![
            ("arguments".to_owned(), arguments),
            ("now".to_owned(), RestrictedExpression::new_long(now)),
        ];
        if let Some(client) = client {
            context.push((
                "client".to_owned(),
                RestrictedExpression::new_string(client.to_owned()),
            ));
        }
        let context = match cedar_policy::Context::from_pairs(context) {
            Ok(context) => context,
            Err(error) => return CedarAnswer::denied(error.to_string()),
        };
        let request = match cached.request(&action.uid, action, context) {
            Ok(request) => request,
            Err(denied) => return denied,
        };
        if let Some(fast) = &cached.call.fast
            && fast.no_forbid(&request, &cached.entities)
        {
            // No open `forbid` is satisfied or errs: only the `permit`s are left to name.
            if fast.permits.is_empty() {
                return cached.call.answer(None, false);
            }
            let (permits, allowed) = self.set.evaluate(&request, &fast.permits, cached);
            return cached.call.answer(Some(permits), allowed);
        }
        let (open, allowed) = self.set.evaluate(&request, &cached.call.open, cached);
        cached.call.answer(Some(open), allowed)
    }

    /// Whether tools/list shows the tool to the caller: Cedar permits the action `tools/list` on
    /// it, and the tool's call action is not denied whatever the arguments (Cedar's partial
    /// evaluation with the context unknown does not answer Deny). So a listed tool is callable
    /// for some arguments as far as Cedar can tell without them; a tool forbidden to the caller
    /// outright is not listed.
    pub fn listing(&self) -> CedarAnswer {
        // It depends on nothing but the caller, the tool and this set: kept with the entities.
        self.cached
            .listing
            .get_or_init(|| self.set.listing(&self.cached, self.action))
            .clone()
    }
}

/// One request as `toolgate-server policy test` and `policy explain` state it: a caller with its
/// attributes, a tool, its arguments, the time and the client's name.
#[derive(Debug, Clone, Default, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Request {
    /// The caller.
    pub principal: Principal,
    /// The tool called (or listed).
    pub tool: String,
    /// The call's arguments (absent: `{}`).
    #[serde(default)]
    pub arguments: Map<String, Value>,
    /// The time of the call, seconds since the Unix epoch (absent: now).
    #[serde(default)]
    pub now: Option<i64>,
    /// The name the client declared.
    #[serde(default)]
    pub client: Option<String>,
}

/// A caller as a test case states it (what a credential would say).
#[derive(Debug, Clone, Default, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Principal {
    /// The identity key (`alice`, `acme/alice`, `ISSUER#acme/alice`): the JSON policy's
    /// principal and the Cedar entity id.
    pub id: String,
    /// The name within its tenant (absent: the id).
    #[serde(default)]
    pub name: Option<String>,
    /// `stdio` (the default) or `http`.
    #[serde(default)]
    pub channel: Option<String>,
    /// The tenant.
    #[serde(default)]
    pub tenant: Option<String>,
    /// The scopes.
    #[serde(default)]
    pub scopes: BTreeSet<String>,
    /// The roles.
    #[serde(default)]
    pub roles: BTreeSet<String>,
    /// The other attributes (tags).
    #[serde(default)]
    pub attributes: BTreeMap<String, String>,
}

impl Principal {
    /// The caller as Cedar sees it.
    pub fn caller(&self) -> CedarCaller<'_> {
        CedarCaller {
            id: &self.id,
            name: self.name.as_deref().unwrap_or(&self.id),
            channel: self.channel.as_deref().unwrap_or("stdio"),
            scopes: &self.scopes,
            tenant: self.tenant.as_deref(),
            roles: &self.roles,
            attributes: &self.attributes,
        }
    }
}

/// How the JSON policy and Cedar decided one request, in the gate's order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Explanation {
    /// Whether tools/list shows the tool to the caller.
    pub listed: bool,
    /// Whether the call runs (as far as the policies decide: the gate's other checks, such as
    /// the input schema, rights and rate limits, come on top).
    pub allowed: bool,
    /// The rule that decided: `allow` when both allow, the JSON policy's rule (`deny`,
    /// `default_deny`, `arg_rules.…`) when it refused, `cedar.list` when Cedar does not list the
    /// tool, `cedar` when Cedar refused the call.
    pub rule: String,
    /// Cedar's answer, when Cedar was asked (the JSON policy allowed the tool).
    pub cedar: Option<CedarAnswer>,
}

/// Decides `request` as the gate does: the JSON policy first (a tool it hides is hidden), then
/// Cedar's listing (a tool Cedar does not list is hidden), then the JSON policy's argument rules,
/// then Cedar's decision on the call. `cedar` is `None` for a policy without Cedar.
pub fn explain(
    policy: &crate::Policy,
    cedar: Option<&CedarPolicies>,
    request: &Request,
) -> Explanation {
    let principal = &request.principal.id;
    let arguments = Some(&request.arguments);
    let decision = policy.decide_for(principal, &request.tool, arguments);
    let refused = |listed: bool, rule: String, cedar: Option<CedarAnswer>| Explanation {
        listed,
        allowed: false,
        rule,
        cedar,
    };
    if let crate::Decision::DenyTool(denial) = &decision {
        return refused(false, denial.rule(), None);
    }
    let Some(cedar) = cedar else {
        return Explanation {
            listed: true,
            allowed: decision.is_allow(),
            rule: decision.rule(),
            cedar: None,
        };
    };
    let caller = request.principal.caller();
    let listing = cedar.authorize_listing(&caller, &request.tool);
    if !listing.allowed {
        return refused(false, "cedar.list".to_owned(), Some(listing));
    }
    if !decision.is_allow() {
        return refused(true, decision.rule(), None);
    }
    let now = request.now.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| {
                i64::try_from(since.as_secs()).unwrap_or(i64::MAX)
            })
    });
    let answer = cedar.authorize_call(
        &caller,
        &request.tool,
        arguments,
        now,
        request.client.as_deref(),
    );
    Explanation {
        listed: true,
        allowed: answer.allowed,
        rule: if answer.allowed { "allow" } else { "cedar" }.to_owned(),
        cedar: Some(answer),
    }
}

/// The policies of `set` whose action scope admits `action` (a member of `group`, when given):
/// any action, `action` itself, or a list naming it or its group; and, when `resource` is given,
/// whose resource scope can admit it (a tool is in nothing but itself). A policy left out has a
/// false scope for every such request: Cedar's decision and diagnostics over the rest are the
/// same.
fn scoped(
    set: &cedar_policy::PolicySet,
    action: &cedar_policy::EntityUid,
    group: Option<&cedar_policy::EntityUid>,
    resource: Option<&cedar_policy::EntityUid>,
) -> Result<cedar_policy::PolicySet, CedarError> {
    use cedar_policy::{ActionConstraint, ResourceConstraint};
    let admits = |uid: &cedar_policy::EntityUid| uid == action || Some(uid) == group;
    cedar_policy::PolicySet::from_policies(
        set.policies()
            .filter(|policy| match policy.action_constraint() {
                ActionConstraint::Any => true,
                ActionConstraint::Eq(uid) => uid == *action,
                ActionConstraint::In(uids) => uids.iter().any(admits),
            })
            .filter(|policy| match (resource, policy.resource_constraint()) {
                (
                    Some(resource),
                    ResourceConstraint::Eq(uid)
                    | ResourceConstraint::In(uid)
                    | ResourceConstraint::IsIn(_, uid),
                ) => uid == *resource,
                _ => true,
            })
            .cloned(),
    )
    .map_err(|error| CedarError::Schema(error.to_string()))
}

/// The policies of a caller's requests about a tool (already narrowed by action, resource and
/// principal scope, [`scoped`] and [`for_caller`]), split by Cedar's partial evaluation with the
/// call's context unknown: those satisfied whatever the context (they cannot err either), those
/// false whatever it (left out), and the rest (their conditions read the context, or they err),
/// which Cedar evaluates on each call. Partial evaluation is sound: a policy it decides without
/// the context is decided the same way with any context.
#[derive(Debug)]
struct SplitPolicies {
    /// The names of the `forbid`s satisfied whatever the context, sorted.
    forbids: Arc<[String]>,
    /// The names of the `permit`s satisfied whatever the context, sorted.
    permits: Arc<[String]>,
    /// The policies Cedar has to evaluate with the context.
    open: cedar_policy::PolicySet,
    /// The answer when the call is denied whatever the context: then the tool is not listed.
    denied: Option<CedarAnswer>,
    /// A shortcut for the usual case, when no `forbid` applies: see [`FastPath`].
    fast: Option<FastPath>,
}

/// The open `forbid`s as one policy, `forbid when { R1 || R2 || ... }` over their residuals
/// (their conditions with everything but the context folded in by the partial evaluation), and
/// the open `permit`s. When that one policy is neither satisfied nor in error, no open `forbid`
/// is (`||` evaluates every operand up to the first true one, and an error in any is its
/// error), so the answer needs only the `permit`s; otherwise every open policy is evaluated.
/// One policy over the residuals costs a fraction of evaluating each `forbid` whole. Like the
/// open policies, it carries no source locations ([`without_locations`]).
#[derive(Debug)]
struct FastPath {
    any_forbid: cedar_policy::PolicySet,
    permits: cedar_policy::PolicySet,
}

/// How many open `forbid`s one combined policy takes at most (its `||` tree is balanced).
const MAX_COMBINED_FORBIDS: usize = 1024;

impl FastPath {
    /// The shortcut for `open` (none when it would not help or a residual cannot be combined:
    /// then every open policy is evaluated on each call).
    fn new(
        partial: &cedar_policy::PartialResponse,
        open: &cedar_policy::PolicySet,
    ) -> Option<Self> {
        let mut residuals = Vec::new();
        let mut permits = cedar_policy::PolicySet::new();
        for policy in open.policies() {
            if policy.effect() == cedar_policy::Effect::Permit {
                permits.add(policy.clone()).ok()?;
                continue;
            }
            residuals.push(residual_condition(partial, policy.id())?);
        }
        if residuals.len() < 2 || residuals.len() > MAX_COMBINED_FORBIDS {
            return None;
        }
        let any = json!({
            "effect": "forbid",
            "principal": {"op": "All"},
            "action": {"op": "All"},
            "resource": {"op": "All"},
            "conditions": [{"kind": "when", "body": disjunction(&residuals)}],
        });
        let any = cedar_policy::Policy::from_json(
            Some(cedar_policy::PolicyId::new("toolgate.any_forbid")),
            any,
        )
        .ok()?;
        Some(FastPath {
            any_forbid: cedar_policy::PolicySet::from_policies([any]).ok()?,
            permits,
        })
    }

    /// Whether no open `forbid` is satisfied or errs in `request`: the combined one is neither.
    fn no_forbid(
        &self,
        request: &cedar_policy::Request,
        entities: &cedar_policy::Entities,
    ) -> bool {
        let response =
            cedar_policy::Authorizer::new().is_authorized(request, &self.any_forbid, entities);
        response.diagnostics().reason().next().is_none()
            && response.diagnostics().errors().next().is_none()
    }
}

/// The condition of `id`'s residual (JSON form): its conditions with everything but the context
/// folded in by the partial evaluation, the unknown context made the variable `context`, as one
/// conjunction. None when it has no residual or holds another unknown.
fn residual_condition(
    partial: &cedar_policy::PartialResponse,
    id: &cedar_policy::PolicyId,
) -> Option<Value> {
    let mut residual = partial.get(id)?.to_json().ok()?;
    if !context_for_unknown(&mut residual) {
        return None;
    }
    let mut residual = conjunction(residual.get("conditions")?.as_array()?)?;
    without_true(&mut residual);
    Some(residual)
}

/// An open policy as Cedar evaluates it on each call: the same id, effect and annotations over
/// its residual condition ([`residual_condition`]: the caller, the tool and the entities are
/// already folded in, so only what reads the context is left), without source locations. Its
/// decision and its errors for a request of this caller about this tool are the policy's.
/// The policy itself, without locations, when its residual cannot be used (it holds another
/// unknown).
fn residual_policy(
    partial: &cedar_policy::PartialResponse,
    policy: &cedar_policy::Policy,
) -> cedar_policy::Policy {
    let residual = residual_condition(partial, policy.id()).and_then(|body| {
        let mut json = policy.to_json().ok()?;
        let object = json.as_object_mut()?;
        for scope in ["principal", "action", "resource"] {
            object.insert(scope.to_owned(), json!({"op": "All"}));
        }
        object.insert(
            "conditions".to_owned(),
            json!([{"kind": "when", "body": body}]),
        );
        cedar_policy::Policy::from_json(Some(policy.id().clone()), json).ok()
    });
    residual.unwrap_or_else(|| without_locations(policy))
}

/// `policy` without its source locations (the same policy through its JSON form, same id and
/// annotations): Cedar's evaluator copies an expression's location onto every value it
/// computes, which costs a policy evaluated on every call more than the rest of its evaluation.
/// The policy itself if it has no JSON form.
fn without_locations(policy: &cedar_policy::Policy) -> cedar_policy::Policy {
    policy
        .to_json()
        .ok()
        .and_then(|json| cedar_policy::Policy::from_json(Some(policy.id().clone()), json).ok())
        .unwrap_or_else(|| policy.clone())
}

/// Replaces the unknown context of a residual (JSON form) with the variable `context`; false when
/// it holds any other unknown.
fn context_for_unknown(value: &mut Value) -> bool {
    match value {
        Value::Object(map) => {
            if let Some(arguments) = map.get("unknown") {
                if map.len() == 1 && *arguments == json!([{"Value": "context"}]) {
                    *value = json!({"Var": "context"});
                    return true;
                }
                return false;
            }
            map.values_mut().all(context_for_unknown)
        }
        Value::Array(items) => items.iter_mut().all(context_for_unknown),
        _ => true,
    }
}

/// Folds `true && x` and `x && true` into `x` (JSON form), which the partial evaluation leaves
/// where a scope or a condition was decided: the same value and the same errors (`&&` and the
/// `||` and `when` around it all require a boolean), fewer steps.
fn without_true(value: &mut Value) {
    let truth = json!({"Value": true});
    while let Some(both) = value.get_mut("&&") {
        let (Some(left), Some(right)) = (both.get("left"), both.get("right")) else {
            break;
        };
        if *left == truth {
            *value = right.clone();
        } else if *right == truth {
            *value = left.clone();
        } else {
            break;
        }
    }
    match value {
        Value::Object(map) => map.values_mut().for_each(without_true),
        Value::Array(items) => items.iter_mut().for_each(without_true),
        _ => {}
    }
}

/// The conjunction of a policy's conditions (JSON form): each `when` body, each `unless` body
/// negated.
fn conjunction(conditions: &[Value]) -> Option<Value> {
    let mut all = json!({"Value": true});
    for condition in conditions {
        let body = condition.get("body")?.clone();
        let term = match condition.get("kind")?.as_str()? {
            "when" => body,
            "unless" => json!({"!": {"arg": body}}),
            _ => return None,
        };
        all = json!({"&&": {"left": all, "right": term}});
    }
    Some(all)
}

/// `a || b || ...` as a balanced tree (JSON form), left to right.
fn disjunction(terms: &[Value]) -> Value {
    match terms {
        [] => json!({"Value": false}),
        [one] => one.clone(),
        _ => {
            let (left, right) = terms.split_at(terms.len() / 2);
            json!({"||": {"left": disjunction(left), "right": disjunction(right)}})
        }
    }
}

impl SplitPolicies {
    fn new(
        set: &cedar_policy::PolicySet,
        request: &cedar_policy::Request,
        entities: &cedar_policy::Entities,
        name: impl Fn(&cedar_policy::PolicyId) -> String,
    ) -> Result<Self, String> {
        let partial = cedar_policy::Authorizer::new().is_authorized_partial(request, set, entities);
        let (mut forbids, mut permits) = (Vec::new(), Vec::new());
        for policy in partial.definitely_satisfied() {
            match policy.effect() {
                cedar_policy::Effect::Forbid => forbids.push(name(policy.id())),
                cedar_policy::Effect::Permit => permits.push(name(policy.id())),
            }
        }
        forbids.sort();
        permits.sort();
        let mut split = SplitPolicies {
            forbids: forbids.into(),
            permits: permits.into(),
            open: cedar_policy::PolicySet::new(),
            denied: None,
            fast: None,
        };
        let open: HashSet<cedar_policy::PolicyId> = partial
            .nontrivial_residuals()
            .map(|policy| policy.id().clone())
            .chain(partial.definitely_errored().cloned())
            .collect();
        let errored: HashSet<&cedar_policy::PolicyId> = partial.definitely_errored().collect();
        for policy in set.policies().filter(|policy| open.contains(policy.id())) {
            let policy = if errored.contains(policy.id()) {
                without_locations(policy)
            } else {
                residual_policy(&partial, policy)
            };
            split.open.add(policy).map_err(|e| e.to_string())?;
        }
        if split.forbids.is_empty() && partial.definitely_errored().next().is_none() {
            split.fast = FastPath::new(&partial, &split.open);
        }
        if partial.decision() == Some(cedar_policy::Decision::Deny) {
            split.denied = Some(CedarAnswer {
                allowed: false,
                determining: Arc::clone(&split.forbids),
                errors: partial
                    .definitely_errored()
                    .map(|id| format!("policy {} failed", name(id)))
                    .collect(),
            });
        }
        Ok(split)
    }

    /// Cedar's answer over the whole subset, from its answer over the open part (`None` when
    /// that part is empty and was not evaluated): a satisfied `forbid` denies, naming every
    /// satisfied `forbid`; else a satisfied `permit` allows, naming every satisfied `permit`;
    /// else it is denied with no policy named. Any error denies.
    fn answer(&self, open: Option<CedarAnswer>, open_allowed: bool) -> CedarAnswer {
        let (open, errors) = open.map_or((None, Vec::new()), |answer| {
            (Some(answer.determining), answer.errors)
        });
        let open_forbids = open.as_ref().filter(|_| !open_allowed);
        let open_permits = open.as_ref().filter(|_| open_allowed);
        let merged = |known: &Arc<[String]>, open: Option<&Arc<[String]>>| match open {
            Some(open) if !open.is_empty() => {
                let mut all: Vec<String> = known.iter().chain(open.iter()).cloned().collect();
                all.sort();
                all.into()
            }
            _ => Arc::clone(known),
        };
        if !self.forbids.is_empty() || open_forbids.is_some_and(|names| !names.is_empty()) {
            return CedarAnswer {
                allowed: false,
                determining: merged(&self.forbids, open_forbids),
                errors,
            };
        }
        let determining = merged(&self.permits, open_permits);
        CedarAnswer {
            allowed: !determining.is_empty() && errors.is_empty(),
            determining,
            errors,
        }
    }
}

/// The policies of `set` whose principal scope can admit `caller`, a member of `roles` and of
/// nothing else: any principal, a type test, the caller itself, or `in` the caller or one of its
/// roles. A policy left out has a false scope for every request of this caller, so it is neither
/// satisfied nor in error: Cedar's decision and diagnostics over the rest are the same.
fn for_caller(
    set: &cedar_policy::PolicySet,
    caller: &cedar_policy::EntityUid,
    roles: &HashSet<cedar_policy::EntityUid>,
) -> Result<cedar_policy::PolicySet, String> {
    use cedar_policy::PrincipalConstraint;
    cedar_policy::PolicySet::from_policies(
        set.policies()
            .filter(|policy| match policy.principal_constraint() {
                PrincipalConstraint::Any
                | PrincipalConstraint::Is(_)
                | PrincipalConstraint::IsIn(..) => true,
                PrincipalConstraint::Eq(uid) => uid == *caller,
                PrincipalConstraint::In(uid) => uid == *caller || roles.contains(&uid),
            })
            .cloned(),
    )
    .map_err(|error| error.to_string())
}

/// Parses a policy set, every syntax error with its line.
fn parse(text: &str, source_name: &str) -> Result<cedar_policy::PolicySet, CedarError> {
    cedar_policy::PolicySet::from_str(text).map_err(|errors| CedarError::Syntax {
        source_name: source_name.to_owned(),
        problems: errors
            .iter()
            .map(|error| CedarProblem {
                policy: "?".to_owned(),
                line: first_line(text, error),
                message: error.to_string(),
            })
            .collect(),
    })
}

/// Checks that `source` parses as Cedar (what [`crate::Policy::load`] can check before the
/// tools are known).
pub(crate) fn check_syntax(source: &CedarSource) -> Result<(), CedarError> {
    parse(source.text(), &source.path().display().to_string()).map(drop)
}

/// The resource `Toolgate::Tool` of `tool`, with its attributes.
fn resource(tool: &ToolSignature) -> Result<cedar_policy::Entity, String> {
    let flag = RestrictedExpression::new_bool;
    let mut attributes = HashMap::from([
        ("read_only".to_owned(), flag(tool.read_only)),
        ("destructive".to_owned(), flag(tool.destructive)),
        ("idempotent".to_owned(), flag(tool.idempotent)),
        ("open_world".to_owned(), flag(tool.open_world)),
    ]);
    if let Some(effect) = &tool.effect {
        attributes.insert(
            "effect".to_owned(),
            RestrictedExpression::new_string(effect.clone()),
        );
    }
    attributes.insert(
        "tags".to_owned(),
        RestrictedExpression::new_set(
            tool.tags
                .iter()
                .cloned()
                .map(RestrictedExpression::new_string),
        ),
    );
    cedar_policy::Entity::new(entity_uid("Tool", &tool.name)?, attributes, HashSet::new())
        .map_err(|e| e.to_string())
}

fn entity_uid(kind: &str, id: &str) -> Result<cedar_policy::EntityUid, String> {
    let kind = cedar_policy::EntityTypeName::from_str(&format!("{NAMESPACE}::{kind}"))
        .map_err(|e| e.to_string())?;
    Ok(cedar_policy::EntityUid::from_type_name_and_id(
        kind,
        cedar_policy::EntityId::new(id),
    ))
}

fn action_uid(id: &str) -> Result<cedar_policy::EntityUid, String> {
    entity_uid("Action", id)
}

/// The Cedar value of the JSON object `value` as the record type `shape` (the JSON form
/// [`record`] writes) types it: declared members only, `null` ones left out.
fn project_record(
    value: &Map<String, Value>,
    shape: &Value,
) -> Result<RestrictedExpression, String> {
    let mut fields = Vec::new();
    if let Some(attributes) = shape.get("attributes").and_then(Value::as_object) {
        for (name, kind) in attributes {
            match value.get(name) {
                None | Some(Value::Null) => {
                    if kind.get("required") != Some(&Value::Bool(false)) {
                        return Err(format!("`{name}` is missing"));
                    }
                }
                Some(member) => fields.push((
                    name.clone(),
                    project(member, kind).map_err(|e| format!("`{name}`: {e}"))?,
                )),
            }
        }
    }
    RestrictedExpression::new_record(fields).map_err(|e| e.to_string())
}

/// The Cedar value of `value` as the type `kind` (JSON form).
fn project(value: &Value, kind: &Value) -> Result<RestrictedExpression, String> {
    match (kind.get("type").and_then(Value::as_str), value) {
        (Some("String"), Value::String(text)) => Ok(RestrictedExpression::new_string(text.clone())),
        (Some("Boolean"), Value::Bool(flag)) => Ok(RestrictedExpression::new_bool(*flag)),
        (Some("Long"), Value::Number(number)) => number
            .as_i64()
            .or_else(|| {
                number
                    .as_f64()
                    .filter(|f| f.fract() == 0.0 && f.abs() < 9.0e15)
                    .map(|f| f as i64)
            })
            .map(RestrictedExpression::new_long)
            .ok_or_else(|| "not an integer Cedar can hold (a 64-bit integer)".to_owned()),
        (Some("Set"), Value::Array(items)) => {
            let element = kind.get("element").unwrap_or(&Value::Null);
            let items = items
                .iter()
                .map(|item| project(item, element))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(RestrictedExpression::new_set(items))
        }
        (Some("Record"), Value::Object(members)) => project_record(members, kind),
        (Some(kind), _) => Err(format!("not a {kind}")),
        (None, _) => Err("has no Cedar type".to_owned()),
    }
}

/// A policy's `@id` annotation, else its positional id.
fn policy_name(policies: &cedar_policy::PolicySet, id: &cedar_policy::PolicyId) -> String {
    policies
        .annotation(id, "id")
        .map_or_else(|| id.to_string(), str::to_owned)
}

/// The 1-based line of the first place `error` points at in `text`.
fn first_line(text: &str, error: &dyn miette::Diagnostic) -> Option<usize> {
    let offset = error.labels()?.map(|label| label.offset()).min()?;
    let before = text.get(..offset.min(text.len()))?;
    Some(before.bytes().filter(|b| *b == b'\n').count() + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Through the whole pipeline (partial evaluation, residuals, one combined condition): the
    /// usual open `forbid`s get the shortcut, and it decides as the policies do.
    #[test]
    fn open_forbids_are_decided_through_one_combined_condition() {
        let tool = ToolSignature::new(
            "echo",
            json!({"type": "object", "properties": {"text": {"type": "string"}},
                   "required": ["text"]}),
        );
        let echo = r#"action == Toolgate::Action::"echo""#;
        let text = format!(
            r#"@id("p") permit(principal, {echo}, resource);
            @id("like") forbid(principal, {echo}, resource) when {{ context.arguments.text like "*no*" }};
            @id("time") forbid(principal, {echo}, resource) when {{ context.now < 100 && resource.read_only == false }};
            @id("tenant") forbid(principal, {echo}, resource) when {{ principal has tenant && context has client }};
            @id("client") forbid(principal, {echo}, resource) unless {{ context has client && context.client like "c*" }};"#
        );
        let set = CedarPolicies::from_text(&text, "test.cedar", &[tool]).unwrap();
        let (scopes, roles, attributes) = Default::default();
        let caller = CedarCaller {
            id: "local",
            name: "local",
            channel: "stdio",
            scopes: &scopes,
            tenant: None,
            roles: &roles,
            attributes: &attributes,
        };
        let cached = set.entities(&caller, &set.tools["echo"]).unwrap();
        assert!(cached.call.fast.is_some(), "{:?}", cached.call);
        for (text, now, client, allowed, determining) in [
            ("yes", 500, Some("cli"), true, vec!["p"]),
            ("no", 500, Some("cli"), false, vec!["like"]),
            ("yes", 5, Some("cli"), false, vec!["time"]),
            ("yes", 500, None, false, vec!["client"]),
            ("no", 5, Some("x"), false, vec!["client", "like", "time"]),
        ] {
            let arguments = json!({"text": text});
            let answer = set.authorize_call(&caller, "echo", arguments.as_object(), now, client);
            assert_eq!(
                answer.allowed, allowed,
                "{text} {now} {client:?}: {answer:?}"
            );
            assert_eq!(&*answer.determining, determining.as_slice());
        }
    }
}
