//! toolgate.lock written from fuzz-chosen contracts (names, descriptions, arbitrary JSON schemas,
//! annotations, handler facts). Properties: a contract that builds renders to a lockfile that
//! parses back to the same contract, digests included; rendering is a fixed point.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use serde_json::{Map, Number, Value};
use toolgate_canon::Sha256Digest;
use toolgate_contract::contract::{ServerContract, ToolContract};
use toolgate_contract::lockfile::Lockfile;
use toolgate_contract::{Annotations, Entitlements, HandlerFacts, ToolDefinition};

#[derive(Arbitrary, Debug)]
enum Json {
    Null,
    Bool(bool),
    Int(i64),
    Uint(u64),
    Float(f64),
    Str(String),
    Arr(Vec<Json>),
    Obj(Vec<(String, Json)>),
}

impl Json {
    fn to_value(&self, depth: usize) -> Value {
        match self {
            Json::Null => Value::Null,
            Json::Bool(b) => Value::Bool(*b),
            Json::Int(i) => Value::from(*i),
            Json::Uint(u) => Value::from(*u),
            Json::Float(f) => Number::from_f64(*f).map_or(Value::Null, Value::Number),
            Json::Str(s) => Value::String(s.clone()),
            _ if depth >= 8 => Value::Null,
            Json::Arr(items) => Value::Array(items.iter().map(|j| j.to_value(depth + 1)).collect()),
            Json::Obj(members) => Value::Object(object(members, depth)),
        }
    }
}

fn object(members: &[(String, Json)], depth: usize) -> Map<String, Value> {
    members
        .iter()
        .map(|(k, v)| (k.clone(), v.to_value(depth + 1)))
        .collect()
}

#[derive(Arbitrary, Debug)]
struct Tool {
    name: String,
    description: Option<String>,
    input_schema: Vec<(String, Json)>,
    output_schema: Option<Vec<(String, Json)>>,
    annotations: [Option<bool>; 4],
    gate_stages: Vec<String>,
    fingerprint: [u8; 32],
    entitlements: [bool; 7],
    evasion: Vec<String>,
    unresolved: Vec<String>,
}

#[derive(Arbitrary, Debug)]
struct Input {
    server: String,
    version: String,
    tools: Vec<Tool>,
}

fuzz_target!(|input: Input| {
    let mut tools = Vec::new();
    for tool in &input.tools {
        let def = ToolDefinition {
            name: tool.name.clone(),
            description: tool.description.clone(),
            input_schema: Value::Object(object(&tool.input_schema, 0)),
            output_schema: tool
                .output_schema
                .as_ref()
                .map(|members| Value::Object(object(members, 0))),
            annotations: Annotations {
                read_only: tool.annotations[0],
                destructive: tool.annotations[1],
                idempotent: tool.annotations[2],
                open_world: tool.annotations[3],
            },
        };
        let [
            fs_read,
            fs_write,
            network,
            subprocess,
            crypto,
            unsafe_ffi,
            environment,
        ] = tool.entitlements;
        let facts = HandlerFacts {
            gate_stages: tool.gate_stages.clone(),
            policy_fingerprint: Sha256Digest::from_bytes(tool.fingerprint),
            entitlements: Entitlements {
                filesystem_read: fs_read,
                filesystem_write: fs_write,
                network,
                subprocess,
                crypto,
                unsafe_ffi,
                environment,
            },
            evasion: tool.evasion.clone(),
            unresolved: tool.unresolved.clone(),
        };
        let Ok(contract) = ToolContract::build(&def, &facts) else {
            return;
        };
        tools.push(contract);
    }
    let Ok(contract) = ServerContract::new(input.server.clone(), tools) else {
        return;
    };
    let lockfile = Lockfile::new(contract, &input.version);
    let rendered = lockfile.render();
    let parsed = match Lockfile::parse(&rendered) {
        Ok(parsed) => parsed,
        Err(e) => panic!("a rendered lockfile does not parse: {e}\n{rendered}"),
    };
    assert_eq!(
        parsed, lockfile,
        "the lockfile changed on the way through the file"
    );
    assert_eq!(parsed.integrity_digest(), lockfile.integrity_digest());
    assert_eq!(parsed.render(), rendered, "rendering is not a fixed point");
});
