//! `toolgate-server serve --http` as a real process, driven by raw HTTP/1.1 requests on loopback:
//! API tokens created and revoked by the CLI, every request authenticated, the principal from the
//! token only, refusals audited without the token, Origin checked, sessions bound to principals.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::{TestEnv, output_text};
use serde_json::{Value, json};

/// Runs an operator command of `env` and returns its stdout, asserting success.
fn operator(env: &TestEnv, args: &[&str]) -> String {
    let output = common::run_to_end({
        let mut command = env.command();
        command.args(args);
        command
    });
    assert!(output.status.success(), "{}", output_text(&output));
    String::from_utf8(output.stdout).unwrap()
}

fn create_token(env: &TestEnv, principal: &str, extra: &[&str]) -> String {
    let mut args = vec!["token", "create", "--principal", principal];
    args.extend_from_slice(extra);
    operator(env, &args).trim().to_owned()
}

/// The server over HTTP, killed on drop.
struct HttpServer {
    child: Child,
    port: u16,
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl HttpServer {
    fn start(env: &TestEnv) -> HttpServer {
        HttpServer::start_with(env, &[])
    }

    fn start_with(env: &TestEnv, args: &[&str]) -> HttpServer {
        let mut command = env.command();
        command.args(["serve", "--http", "127.0.0.1:0"]).args(args);
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(at) = line
                    .split("serving Streamable HTTP at http://127.0.0.1:")
                    .nth(1)
                {
                    let port: u16 = at.split('/').next().unwrap().parse().unwrap();
                    let _ = tx.send(port);
                }
            }
        });
        let port = rx
            .recv_timeout(Duration::from_secs(120))
            .expect("the server says where it listens");
        HttpServer { child, port }
    }

    /// POSTs `body` to /mcp with `headers`; returns the status, the headers (lowercased names)
    /// and the body.
    fn post(&self, headers: &[(&str, &str)], body: &Value) -> (u16, Vec<(String, String)>, String) {
        let host = format!("127.0.0.1:{}", self.port);
        let mut all = vec![
            ("Host", host.as_str()),
            ("Content-Type", "application/json"),
            ("Accept", "application/json, text/event-stream"),
        ];
        all.extend_from_slice(headers);
        self.send("POST", &all, body.to_string().as_bytes())
    }

    /// `method` /mcp with exactly `headers` (nothing added but `Content-Length`, unless given,
    /// and `Connection: close`) and `body`, as an attacker would send it.
    fn send(
        &self,
        method: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> (u16, Vec<(String, String)>, String) {
        let mut request = format!("{method} /mcp HTTP/1.1\r\n").into_bytes();
        for (name, value) in headers {
            request.extend_from_slice(format!("{name}: {value}\r\n").as_bytes());
        }
        if !headers
            .iter()
            .any(|(name, _)| name.eq_ignore_ascii_case("content-length"))
        {
            request.extend_from_slice(format!("Content-Length: {}\r\n", body.len()).as_bytes());
        }
        request.extend_from_slice(b"Connection: close\r\n\r\n");
        request.extend_from_slice(body);
        self.exchange_bytes(&request)
    }

    fn get(&self, path: &str) -> (u16, Vec<(String, String)>, String) {
        self.exchange(&format!(
            "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nConnection: close\r\n\r\n",
            self.port
        ))
    }

    fn exchange(&self, request: &str) -> (u16, Vec<(String, String)>, String) {
        self.exchange_bytes(request.as_bytes())
    }

    fn exchange_bytes(&self, request: &[u8]) -> (u16, Vec<(String, String)>, String) {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(120)))
            .unwrap();
        stream.write_all(request).unwrap();
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).unwrap();
        let text = String::from_utf8(raw).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        let mut lines = head.lines();
        let status: u16 = lines
            .next()
            .unwrap()
            .split(' ')
            .nth(1)
            .unwrap()
            .parse()
            .unwrap();
        let headers = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(n, v)| (n.to_ascii_lowercase(), v.trim().to_owned()))
            .collect::<Vec<_>>();
        let chunked = headers
            .iter()
            .any(|(n, v)| n == "transfer-encoding" && v.contains("chunked"));
        let body = if chunked {
            dechunk(body)
        } else {
            body.to_owned()
        };
        (status, headers, body)
    }

    /// A JSON-RPC request of the 2026-07-28 flow, with its headers, as `token`'s holder.
    fn call(&self, token: &str, id: u64, method: &str, mut params: Value) -> (u16, Value) {
        if !params["_meta"].is_object() {
            params["_meta"] = json!({});
        }
        params["_meta"]["io.modelcontextprotocol/protocolVersion"] = json!("2026-07-28");
        params["_meta"]["io.modelcontextprotocol/clientCapabilities"] = json!({});
        let name = params
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let auth = format!("Bearer {token}");
        let mut headers = vec![
            ("Authorization", auth.as_str()),
            ("MCP-Protocol-Version", "2026-07-28"),
            ("Mcp-Method", method),
        ];
        if !name.is_empty() {
            headers.push(("Mcp-Name", name.as_str()));
        }
        let (status, _, body) = self.post(
            &headers,
            &json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}),
        );
        (
            status,
            serde_json::from_str(&body).unwrap_or(Value::String(body)),
        )
    }
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let size = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if size == 0 {
            break;
        }
        out.push_str(&rest[..size]);
        body = rest[size..].trim_start_matches("\r\n");
    }
    out
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

fn note_call(request_id: &str) -> Value {
    json!({"name": "write_note", "arguments": {"request_id": request_id, "text": "over http"}})
}

fn status_of(reply: &Value) -> String {
    let result = &reply["result"];
    assert_ne!(result["isError"], json!(true), "{reply}");
    result["structuredContent"]["status"]
        .as_str()
        .unwrap_or_else(|| panic!("{reply}"))
        .to_owned()
}

#[test]
fn every_request_is_authenticated_and_served_as_its_tokens_principal() {
    let env = TestEnv::new();
    let alice = create_token(&env, "alice", &[]);
    let bob = create_token(&env, "bob", &[]);
    let expired = create_token(&env, "carol", &["--expires-in", "0"]);
    assert!(alice.starts_with("tgt_") && alice.len() == 68, "{alice}");
    let server = HttpServer::start(&env);

    // Without a token, with garbage, with an expired one: 401 and the challenge.
    let discover = json!({"jsonrpc": "2.0", "id": 1, "method": "server/discover", "params": {}});
    let (status, headers, body) = server.post(&[("MCP-Protocol-Version", "2026-07-28")], &discover);
    assert_eq!(status, 401, "{body}");
    let challenge = header(&headers, "www-authenticate").unwrap();
    assert!(
        challenge.starts_with("Bearer ")
            && challenge.contains(&format!(
                "resource_metadata=\"http://127.0.0.1:{}/.well-known/oauth-protected-resource\"",
                server.port
            )),
        "{challenge}"
    );
    assert!(body.contains("missing_token"), "{body}");
    for (token, code) in [
        ("not-a-token", "invalid_token"),
        (&format!("tgt_{}", "0".repeat(64)), "invalid_token"),
        (expired.as_str(), "expired_token"),
    ] {
        let (status, reply) = server.call(token, 2, "tools/list", json!({}));
        assert_eq!(status, 401, "{reply}");
        assert_eq!(reply["error"], json!(code), "{reply}");
    }

    // The metadata names the resource.
    let (status, _, body) = server.get("/.well-known/oauth-protected-resource");
    assert_eq!(status, 200, "{body}");
    let metadata: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        metadata["resource"],
        json!(format!("http://127.0.0.1:{}/mcp", server.port))
    );

    // A valid token: served, exactly once per key and per principal.
    let (status, reply) = server.call(&alice, 3, "server/discover", json!({}));
    assert_eq!(status, 200, "{reply}");
    let (_, listed) = server.call(&alice, 4, "tools/list", json!({}));
    let names: Vec<&str> = listed["result"]["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("{listed}"))
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert!(
        names.contains(&"write_note") && !names.contains(&"rm_rf"),
        "{names:?}"
    );
    // Filtered for this principal: not for a shared cache.
    assert_eq!(listed["result"]["cacheScope"], json!("private"), "{listed}");
    let (_, first) = server.call(&alice, 5, "tools/call", note_call("req-http-0001"));
    assert_eq!(status_of(&first), "committed");
    let (_, again) = server.call(&alice, 6, "tools/call", note_call("req-http-0001"));
    assert_eq!(status_of(&again), "replay");
    // Another principal's key space: bob's call with the same key executes for bob.
    let (_, bobs) = server.call(&bob, 7, "tools/call", note_call("req-http-0002"));
    assert_eq!(status_of(&bobs), "committed");

    // A foreign Origin is refused even with a valid token.
    let auth = format!("Bearer {alice}");
    let (status, _, body) = server.post(
        &[
            ("Authorization", &auth),
            ("MCP-Protocol-Version", "2026-07-28"),
            ("Mcp-Method", "tools/list"),
            ("Origin", "http://evil.example"),
        ],
        &json!({"jsonrpc": "2.0", "id": 8, "method": "tools/list", "params": {"_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {}}}}),
    );
    assert_eq!(status, 403, "{body}");

    // Revoked while the server runs: refused from the next request on.
    let id = operator(&env, &["token", "list"])
        .lines()
        .find(|l| l.contains(" alice "))
        .unwrap()
        .split(' ')
        .next()
        .unwrap()
        .to_owned();
    operator(&env, &["token", "revoke", &id]);
    let (status, reply) = server.call(&alice, 9, "tools/list", json!({}));
    assert_eq!(status, 401, "{reply}");
    assert_eq!(reply["error"], json!("revoked_token"));

    drop(server);
    let audit = env.audit_text();
    for token in [&alice, &bob, &expired] {
        assert!(
            !audit.contains(token.as_str()),
            "a token reached the audit log"
        );
    }
    let records = env.audit_records();
    let calls: Vec<(&str, &str)> = records
        .iter()
        .filter(|r| r["name"] == "write_note")
        .map(|r| {
            (
                r["principal"].as_str().unwrap(),
                r["outcome"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        calls,
        [
            ("alice", "committed"),
            ("alice", "replay"),
            ("bob", "committed")
        ]
    );
    let refusals: Vec<&str> = records
        .iter()
        .filter(|r| r["method"] == "http/authenticate")
        .map(|r| r["reason"].as_str().unwrap())
        .collect();
    assert_eq!(
        refusals,
        [
            "missing_token",
            "invalid_token",
            "invalid_token",
            "expired_token",
            "revoked_token"
        ]
    );
    // An expired or revoked token of this server is named by its id, never by its secret.
    let named = |code: &str| {
        records
            .iter()
            .find(|r| r["reason"] == code)
            .map(|r| r["request_id"].as_str().unwrap().to_owned())
            .unwrap()
    };
    let id_of = |token: &str| format!("token:{}", &common::sha256_hex(token.as_bytes())[..12]);
    assert_eq!(named("expired_token"), id_of(&expired));
    assert_eq!(named("revoked_token"), id_of(&alice));
    assert_eq!(format!("token:{id}"), id_of(&alice));
    let changes = records
        .iter()
        .filter(|r| r["method"] == "admin/token")
        .count();
    assert_eq!(changes, 4, "three creations and a revocation");
    assert!(env.audit_verify().status.success());
}

#[test]
fn http_refuses_a_configured_principal() {
    let env = TestEnv::new();
    let output = common::run_to_end({
        let mut command = env.command();
        command.args(["--principal", "alice", "serve", "--http", "127.0.0.1:0"]);
        command
    });
    assert_eq!(output.status.code(), Some(2), "{}", output_text(&output));
    assert!(
        output_text(&output).contains("token create"),
        "{}",
        output_text(&output)
    );
}

#[test]
fn a_session_belongs_to_the_principal_that_opened_it() {
    let env = TestEnv::new();
    let alice = create_token(&env, "alice", &[]);
    let bob = create_token(&env, "bob", &[]);
    let mut server = HttpServer::start(&env);
    let (alice_auth, bob_auth) = (format!("Bearer {alice}"), format!("Bearer {bob}"));
    let (status, headers, body) = server.post(
        &[("Authorization", &alice_auth)],
        &json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "http-test", "version": "1"}}}),
    );
    assert_eq!(status, 200, "{body}");
    let session = header(&headers, "mcp-session-id")
        .unwrap_or_else(|| panic!("a session id: {headers:?}"))
        .to_owned();
    let on_session = |auth: &str| {
        vec![
            ("Authorization", auth.to_owned()),
            ("Mcp-Session-Id", session.clone()),
            ("MCP-Protocol-Version", "2025-11-25".to_owned()),
        ]
    };
    let send = |server: &HttpServer, headers: Vec<(&'static str, String)>, body: Value| {
        let headers: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
        server.post(&headers, &body)
    };
    let (status, _, body) = send(
        &server,
        on_session(&alice_auth),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    );
    assert!(status == 202 || status == 200, "{status} {body}");
    let list = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}});
    // Bob's valid token on alice's session: as unknown as a session that never existed.
    let (status, _, body) = send(&server, on_session(&bob_auth), list.clone());
    assert_eq!(status, 404, "{body}");
    let (status, _, body) = send(&server, on_session(&alice_auth), list);
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("write_note"), "{body}");

    // A clean stop on SIGTERM, the chain intact.
    let pid = server.child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let status = common::wait_exit(&mut server.child, Duration::from_secs(120))
        .expect("the server stops on SIGTERM");
    assert!(status.success(), "{status:?}");
    assert!(env.audit_verify().status.success());
}

// --- OAuth 2.1 access tokens ------------------------------------------------------------------

mod issuer {
    //! A local authorization server's half that matters here: keys it generates, a JWKS it
    //! serves on loopback (counting fetches, swappable for a rotation), tokens it signs.

    use std::io::{BufRead, BufReader, Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::{SystemTime, UNIX_EPOCH};

    use base64::Engine as _;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
    use jsonwebtoken::{Algorithm, EncodingKey, Header};
    use ring::rand::SystemRandom;
    use ring::signature::{self, KeyPair as _};
    use serde_json::{Value, json};

    pub(super) const ISSUER: &str = "https://issuer.test";

    /// A signing key and its public JWK.
    pub(super) struct Key {
        pub(super) kid: String,
        pub(super) alg: Algorithm,
        encoding: EncodingKey,
        pub(super) jwk: Value,
        /// The raw public key (what an HMAC-confusion attacker would use as the secret).
        pub(super) public: Vec<u8>,
    }

    impl Key {
        pub(super) fn ed25519(kid: &str) -> Key {
            let pkcs8 = signature::Ed25519KeyPair::generate_pkcs8(&SystemRandom::new()).unwrap();
            let pair = signature::Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap();
            let public = pair.public_key().as_ref().to_vec();
            Key {
                kid: kid.to_owned(),
                alg: Algorithm::EdDSA,
                encoding: EncodingKey::from_ed_der(pkcs8.as_ref()),
                jwk: json!({"kty": "OKP", "crv": "Ed25519", "x": B64.encode(&public),
                    "kid": kid, "alg": "EdDSA", "use": "sig"}),
                public,
            }
        }

        pub(super) fn p256(kid: &str) -> Key {
            let rng = SystemRandom::new();
            let alg = &signature::ECDSA_P256_SHA256_FIXED_SIGNING;
            let pkcs8 = signature::EcdsaKeyPair::generate_pkcs8(alg, &rng).unwrap();
            let pair = signature::EcdsaKeyPair::from_pkcs8(alg, pkcs8.as_ref(), &rng).unwrap();
            let public = pair.public_key().as_ref().to_vec();
            Key {
                kid: kid.to_owned(),
                alg: Algorithm::ES256,
                encoding: EncodingKey::from_ec_der(pkcs8.as_ref()),
                jwk: json!({"kty": "EC", "crv": "P-256", "x": B64.encode(&public[1..33]),
                    "y": B64.encode(&public[33..]), "kid": kid}),
                public,
            }
        }

        /// The test-only RSA 2048-bit key of `fixtures/oauth/` under `kid`, signing with `alg`;
        /// its JWK declares `declared` as its `alg` when given (or no `alg`).
        pub(super) fn rsa(kid: &str, alg: Algorithm, declared: Option<&str>) -> Key {
            let fixture = rsa_fixture(2048);
            let der = base64::engine::general_purpose::STANDARD
                .decode(fixture["pkcs1_der_b64"].as_str().unwrap())
                .unwrap();
            let mut jwk = json!({"kty": "RSA", "n": fixture["n"], "e": fixture["e"], "kid": kid});
            if let Some(declared) = declared {
                jwk["alg"] = json!(declared);
            }
            Key {
                kid: kid.to_owned(),
                alg,
                encoding: EncodingKey::from_rsa_der(&der),
                jwk,
                public: Vec::new(),
            }
        }

        /// `claims` signed with this key.
        pub(super) fn sign(&self, claims: &Value) -> String {
            self.sign_typed(claims, Some("JWT"))
        }

        /// `claims` signed with this key, the header's `typ` being `typ`.
        pub(super) fn sign_typed(&self, claims: &Value, typ: Option<&str>) -> String {
            let mut header = Header::new(self.alg);
            header.kid = Some(self.kid.clone());
            header.typ = typ.map(str::to_owned);
            jsonwebtoken::encode(&header, claims, &self.encoding).unwrap()
        }
    }

    /// `fixtures/oauth/TEST-ONLY-rsa-BITS.json`: a test-only RSA key's `n` and `e` (and its
    /// private key, or for the 1024-bit key, which no signer here accepts, a token it signed).
    pub(super) fn rsa_fixture(bits: u32) -> Value {
        let path = format!(
            "{}/../../fixtures/oauth/TEST-ONLY-rsa-{bits}.json",
            env!("CARGO_MANIFEST_DIR")
        );
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    }

    pub(super) fn now() -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs()
    }

    /// Claims valid for five minutes.
    pub(super) fn claims(audience: &str, subject: &str, scope: &str) -> Value {
        json!({"iss": ISSUER, "aud": audience, "sub": subject, "scope": scope,
            "iat": now(), "exp": now() + 300})
    }

    /// A token with any header, signed with HMAC-SHA256 under `secret` (or unsigned when
    /// `secret` is `None`, as `alg: none` tokens are).
    pub(super) fn forged(header: &Value, claims: &Value, secret: Option<&[u8]>) -> String {
        let message = format!(
            "{}.{}",
            B64.encode(header.to_string()),
            B64.encode(claims.to_string())
        );
        let signature = secret.map_or_else(String::new, |secret| {
            let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret);
            B64.encode(ring::hmac::sign(&key, message.as_bytes()).as_ref())
        });
        format!("{message}.{signature}")
    }

    /// How the JWKS endpoint answers a fetch.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub(super) enum Behaviour {
        /// The published key set.
        Keys,
        /// Reads the request and never answers (until the client gives up).
        Hang,
        /// Headers, then the body one byte a second.
        Trickle,
        /// This status, with an empty body.
        Status(u16),
        /// A redirect to the key set itself.
        Redirect,
        /// A 200 that is not JSON.
        NotJson,
        /// A 200 of 5 MB of JSON.
        Huge,
    }

    /// The JWKS endpoint: serves the current key set (or misbehaves as told), counts fetches.
    pub(super) struct Jwks {
        pub(super) url: String,
        pub(super) fetches: Arc<AtomicUsize>,
        keys: Arc<Mutex<Value>>,
        behaviour: Arc<Mutex<Behaviour>>,
    }

    impl Jwks {
        pub(super) fn serve(keys: &[&Key]) -> Jwks {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let url = format!("http://{}/jwks", listener.local_addr().unwrap());
            let fetches = Arc::new(AtomicUsize::new(0));
            let set = Arc::new(Mutex::new(Value::Null));
            let behaviour = Arc::new(Mutex::new(Behaviour::Keys));
            let jwks = Jwks {
                url: url.clone(),
                fetches: Arc::clone(&fetches),
                keys: Arc::clone(&set),
                behaviour: Arc::clone(&behaviour),
            };
            jwks.publish(keys);
            std::thread::spawn(move || {
                for stream in listener.incoming() {
                    let Ok(stream) = stream else { continue };
                    let (fetches, set, behaviour, url) = (
                        Arc::clone(&fetches),
                        Arc::clone(&set),
                        Arc::clone(&behaviour),
                        url.clone(),
                    );
                    // One thread per connection: a hanging answer holds up no other fetch.
                    std::thread::spawn(move || answer(stream, &fetches, &set, &behaviour, &url));
                }
            });
            jwks
        }

        /// Replaces the published keys (a rotation).
        pub(super) fn publish(&self, keys: &[&Key]) {
            self.publish_raw(
                json!({"keys": keys.iter().map(|k| k.jwk.clone()).collect::<Vec<_>>()}),
            );
        }

        /// Publishes `set` as it is.
        pub(super) fn publish_raw(&self, set: Value) {
            *self.keys.lock().unwrap() = set;
        }

        /// How the next fetches are answered.
        pub(super) fn behave(&self, behaviour: Behaviour) {
            *self.behaviour.lock().unwrap() = behaviour;
        }

        pub(super) fn fetched(&self) -> usize {
            self.fetches.load(Ordering::SeqCst)
        }
    }

    fn answer(
        mut stream: TcpStream,
        fetches: &AtomicUsize,
        set: &Mutex<Value>,
        behaviour: &Mutex<Behaviour>,
        url: &str,
    ) {
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        let mut line = String::new();
        while reader.read_line(&mut line).is_ok_and(|n| n > 0) {
            if line == "\r\n" {
                break;
            }
            line.clear();
        }
        fetches.fetch_add(1, Ordering::SeqCst);
        let behaviour = *behaviour.lock().unwrap();
        let respond = |stream: &mut TcpStream, status: &str, extra: &str, body: &str| {
            let _ = write!(
                stream,
                "HTTP/1.1 {status}\r\nContent-Type: application/json\r\n{extra}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        };
        match behaviour {
            Behaviour::Keys => respond(&mut stream, "200 OK", "", &set.lock().unwrap().to_string()),
            Behaviour::Hang => {
                // Until the client closes the connection.
                let mut rest = Vec::new();
                let _ = reader.read_to_end(&mut rest);
            }
            Behaviour::Trickle => {
                let _ = write!(
                    stream,
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
                );
                while stream.write_all(b" ").is_ok() {
                    std::thread::sleep(std::time::Duration::from_secs(1));
                }
            }
            Behaviour::Status(code) => respond(&mut stream, &format!("{code} Oops"), "", ""),
            Behaviour::Redirect => respond(
                &mut stream,
                "302 Found",
                &format!("Location: {url}\r\n"),
                "",
            ),
            Behaviour::NotJson => respond(&mut stream, "200 OK", "", "<html>keys</html>"),
            Behaviour::Huge => {
                let body = format!("{{\"keys\":[],\"pad\":\"{}\"}}", "x".repeat(5 << 20));
                respond(&mut stream, "200 OK", "", &body);
            }
        }
    }
}

/// A policy that puts `write_note` under the scope `notes:write`.
fn scoped_policy(env: &TestEnv) {
    let mut policy: Value =
        serde_json::from_str(&std::fs::read_to_string(&env.policy).unwrap()).unwrap();
    policy["scopes"] = json!({"notes:write": ["write_note"]});
    std::fs::write(&env.policy, policy.to_string()).unwrap();
}

fn listed_names(reply: &Value) -> Vec<String> {
    reply["result"]["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("{reply}"))
        .iter()
        .filter_map(|t| t["name"].as_str().map(str::to_owned))
        .collect()
}

#[test]
fn oauth_access_tokens_are_checked_as_a_resource_server() {
    use issuer::{Jwks, Key, claims, forged, now};

    let env = TestEnv::new();
    scoped_policy(&env);
    let (k1, es, k2, stranger) = (
        Key::ed25519("k1"),
        Key::p256("e1"),
        Key::ed25519("k2"),
        Key::ed25519("k1"),
    );
    let jwks = Jwks::serve(&[&k1, &es]);
    let server = HttpServer::start_with(
        &env,
        &[
            "--oauth-issuer",
            issuer::ISSUER,
            "--oauth-jwks-url",
            &jwks.url,
            "--oauth-jwks-cooldown",
            "0",
        ],
    );
    assert_eq!(jwks.fetched(), 0, "the key set is fetched lazily");
    let audience = format!("http://127.0.0.1:{}/mcp", server.port);

    // The metadata names the issuer and the policy's scopes.
    let (_, _, body) = server.get("/.well-known/oauth-protected-resource");
    let metadata: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(metadata["authorization_servers"], json!([issuer::ISSUER]));
    assert_eq!(metadata["scopes_supported"], json!(["notes:write"]));

    // Valid tokens (EdDSA and ES256): served as their subjects; the key set is fetched once.
    let writer = k1.sign(&claims(&audience, "alice", "notes:write"));
    let (status, listed) = server.call(&writer, 1, "tools/list", json!({}));
    assert_eq!(status, 200, "{listed}");
    assert!(listed_names(&listed).contains(&"write_note".to_owned()));
    let (_, first) = server.call(&writer, 2, "tools/call", note_call("req-oauth-0001"));
    assert_eq!(status_of(&first), "committed");
    let reader = es.sign(&claims(&audience, "bob", "notes:read"));
    let (status, listed) = server.call(&reader, 3, "tools/list", json!({}));
    assert_eq!(status, 200, "{listed}");
    assert_eq!(jwks.fetched(), 1, "known keys are served from the cache");

    // Bob's token lacks the scope: write_note is not listed and a call is 403 naming it.
    let names = listed_names(&listed);
    assert!(
        !names.contains(&"write_note".to_owned()) && names.contains(&"read_ledger".to_owned()),
        "{names:?}"
    );
    let auth = format!("Bearer {reader}");
    let call = json!({"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {
        "name": "write_note", "arguments": {"request_id": "req-oauth-0002", "text": "x"},
        "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                  "io.modelcontextprotocol/clientCapabilities": {}}}});
    let (status, headers, body) = server.post(
        &[
            ("Authorization", &auth),
            ("MCP-Protocol-Version", "2026-07-28"),
            ("Mcp-Method", "tools/call"),
            ("Mcp-Name", "write_note"),
        ],
        &call,
    );
    assert_eq!(status, 403, "{body}");
    let challenge = header(&headers, "www-authenticate").unwrap();
    assert!(
        challenge.contains("error=\"insufficient_scope\"")
            && challenge.contains("scope=\"notes:write\"")
            && challenge.contains("resource_metadata="),
        "{challenge}"
    );
    assert!(!env.note_path("req-oauth-0002").exists());

    // The refusal matrix: each the right code, nothing executed.
    let mut expired = claims(&audience, "alice", "notes:write");
    expired["exp"] = json!(now() - 3600);
    let mut early = claims(&audience, "alice", "notes:write");
    early["nbf"] = json!(now() + 3600);
    let mut wrong_issuer = claims(&audience, "alice", "notes:write");
    wrong_issuer["iss"] = json!("https://other.test");
    let wrong_audience = claims("https://other.test/mcp", "alice", "notes:write");
    let mut no_audience = claims(&audience, "alice", "notes:write");
    no_audience.as_object_mut().unwrap().remove("aud");
    let good = claims(&audience, "alice", "notes:write");
    let none = forged(&json!({"alg": "none", "kid": "k1"}), &good, None);
    let hmac = forged(
        &json!({"alg": "HS256", "kid": "k1", "typ": "JWT"}),
        &good,
        Some(&k1.public),
    );
    let unknown = Key::ed25519("nobody").sign(&good);
    let cases: Vec<(String, &str)> = vec![
        ("abc.def".to_owned(), "invalid_token"),
        ("e30.e30.e30".to_owned(), "algorithm_not_accepted"),
        (k1.sign(&expired), "expired_token"),
        (k1.sign(&early), "token_not_yet_valid"),
        (k1.sign(&wrong_issuer), "wrong_issuer"),
        (k1.sign(&wrong_audience), "wrong_audience"),
        (k1.sign(&no_audience), "wrong_audience"),
        (stranger.sign(&good), "invalid_token"),
        (unknown, "unknown_key"),
        (none, "algorithm_not_accepted"),
        (hmac, "algorithm_not_accepted"),
    ];
    let mut id = 10;
    for (token, code) in &cases {
        id += 1;
        let (status, reply) = server.call(token, id, "tools/call", note_call("req-oauth-0003"));
        assert_eq!(status, 401, "{code}: {reply}");
        assert_eq!(reply["error"], json!(code), "{reply}");
    }
    assert!(!env.note_path("req-oauth-0003").exists());

    // The issuer rotates to k2: a token naming the new key fetches the set again and is served;
    // a token of the retired key is refused from then on.
    jwks.publish(&[&k2]);
    let before = jwks.fetched();
    let rotated = k2.sign(&claims(&audience, "alice", "notes:write"));
    let (_, replay) = server.call(&rotated, 40, "tools/call", note_call("req-oauth-0001"));
    assert_eq!(
        status_of(&replay),
        "replay",
        "the same principal's key space"
    );
    assert_eq!(jwks.fetched(), before + 1);
    let (status, reply) = server.call(&writer, 41, "tools/list", json!({}));
    assert_eq!(status, 401, "{reply}");

    drop(server);
    let audit = env.audit_text();
    for (token, _) in &cases {
        assert!(
            !audit.contains(token.as_str()),
            "a token reached the audit log"
        );
    }
    assert!(!audit.contains(&writer) && !audit.contains(&reader));
    let records = env.audit_records();
    let refusals: Vec<&str> = records
        .iter()
        .filter(|r| r["method"] == "http/authenticate")
        .map(|r| r["reason"].as_str().unwrap())
        .collect();
    let mut expected: Vec<&str> = cases.iter().map(|(_, code)| *code).collect();
    expected.push("unknown_key");
    assert_eq!(refusals, expected);
    let scoped = records
        .iter()
        .find(|r| r["reason"] == "insufficient_scope")
        .unwrap_or_else(|| panic!("the 403 is audited"));
    assert_eq!(
        (&scoped["principal"], &scoped["channel"], &scoped["outcome"]),
        (
            &json!(format!("{}#bob", issuer::ISSUER)),
            &json!("http"),
            &json!("not_executed")
        )
    );
    assert!(env.audit_verify().status.success());
}

/// The front door's refusal reasons in the audit log (`http/authenticate` records), in order.
fn authentication_reasons(env: &TestEnv) -> Vec<String> {
    env.audit_records()
        .iter()
        .filter(|r| r["method"] == "http/authenticate")
        .map(|r| r["reason"].as_str().unwrap().to_owned())
        .collect()
}

/// The server with OAuth tokens of [`issuer::ISSUER`] whose keys `jwks` serves, and `extra`.
fn start_oauth(env: &TestEnv, jwks: &issuer::Jwks, extra: &[&str]) -> HttpServer {
    let mut args = vec![
        "--oauth-issuer",
        issuer::ISSUER,
        "--oauth-jwks-url",
        &jwks.url,
    ];
    args.extend_from_slice(extra);
    HttpServer::start_with(env, &args)
}

#[test]
fn a_hanging_jwks_is_fetched_once_and_every_waiting_request_is_answered() {
    use issuer::{Behaviour, Jwks, Key, claims};

    let env = TestEnv::new();
    let k1 = Key::ed25519("k1");
    let jwks = Jwks::serve(&[&k1]);
    jwks.behave(Behaviour::Hang);
    let server = start_oauth(
        &env,
        &jwks,
        &["--oauth-jwks-timeout", "3", "--oauth-jwks-cooldown", "3600"],
    );
    let audience = format!("http://127.0.0.1:{}/mcp", server.port);
    // Any token naming a `kid` needs the key set, whoever signed it.
    let tokens: Vec<String> = (0..10)
        .map(|i| k1.sign(&claims(&audience, &format!("user{i}"), "")))
        .collect();
    let answers: Vec<(u16, Value)> = std::thread::scope(|scope| {
        let calls: Vec<_> = tokens
            .iter()
            .zip(1u64..)
            .map(|(token, id)| {
                let server = &server;
                scope.spawn(move || server.call(token, id, "tools/list", json!({})))
            })
            .collect();
        calls.into_iter().map(|call| call.join().unwrap()).collect()
    });
    // Ten answers, and the issuer saw one fetch: every request waited for that one, none
    // started another after it failed.
    assert_eq!(jwks.fetched(), 1, "one fetch for ten concurrent requests");
    for (status, reply) in &answers {
        assert_eq!(*status, 503, "{reply}");
        assert_eq!(reply["error"], json!("jwks_unavailable"), "{reply}");
    }
    // The issuer is back, but the cooldown after the failure holds: answered at once from
    // what is known (nothing), without asking the issuer again.
    jwks.behave(Behaviour::Keys);
    let (status, reply) = server.call(&tokens[0], 20, "tools/list", json!({}));
    assert_eq!(status, 503, "{reply}");
    assert_eq!(jwks.fetched(), 1, "no fetch during the cooldown");
    drop(server);

    let reasons = authentication_reasons(&env);
    assert_eq!(reasons.len(), 11, "{reasons:?}");
    for reason in &reasons {
        assert!(
            reason.starts_with(&format!(
                "jwks_unavailable: the key set of issuer {} could not be fetched (no complete answer within 3 s)",
                issuer::ISSUER
            )),
            "{reason}"
        );
    }
    assert!(env.audit_verify().status.success());
}

#[test]
fn every_broken_jwks_is_refused_as_jwks_unavailable_naming_the_issuer() {
    use issuer::{Behaviour, Jwks, Key, claims};

    let env = TestEnv::new();
    let k1 = Key::ed25519("k1");
    let jwks = Jwks::serve(&[&k1]);
    let server = start_oauth(
        &env,
        &jwks,
        &["--oauth-jwks-timeout", "5", "--oauth-jwks-cooldown", "0"],
    );
    let audience = format!("http://127.0.0.1:{}/mcp", server.port);
    let token = k1.sign(&claims(&audience, "alice", ""));
    let cases = [
        (Behaviour::Hang, "no complete answer within 5 s"),
        (Behaviour::Trickle, "no complete answer within 5 s"),
        (Behaviour::Huge, "larger than 1048576 bytes"),
        (Behaviour::NotJson, "not a JSON Web Key Set"),
        (
            Behaviour::Redirect,
            "a redirect (HTTP 302), which is not followed",
        ),
        (Behaviour::Status(500), "HTTP 500"),
    ];
    for ((behaviour, _), id) in cases.iter().zip(1u64..) {
        jwks.behave(*behaviour);
        let (status, reply) = server.call(&token, id, "tools/list", json!({}));
        assert_eq!(status, 503, "{behaviour:?}: {reply}");
        assert_eq!(reply["error"], json!("jwks_unavailable"), "{reply}");
    }
    // One fetch each (the redirect is not followed); a working set serves the token again.
    assert_eq!(jwks.fetched(), cases.len());
    jwks.behave(Behaviour::Keys);
    let (status, reply) = server.call(&token, 10, "tools/list", json!({}));
    assert_eq!(status, 200, "{reply}");
    drop(server);

    let reasons = authentication_reasons(&env);
    assert_eq!(reasons.len(), cases.len(), "{reasons:?}");
    for (reason, (behaviour, failure)) in reasons.iter().zip(&cases) {
        let expected = format!(
            "jwks_unavailable: the key set of issuer {} could not be fetched ({failure})",
            issuer::ISSUER
        );
        assert!(reason.starts_with(&expected), "{behaviour:?}: {reason}");
    }
}

#[test]
fn keys_that_are_not_signing_keys_are_dropped_and_token_types_are_checked() {
    use issuer::{Jwks, Key, claims, rsa_fixture};
    use jsonwebtoken::Algorithm;

    let env = TestEnv::new();
    let audience = "https://toolgate.test/mcp";
    let k1 = Key::ed25519("k1");
    let rs256 = Key::rsa("rsa", Algorithm::RS256, None);
    let ps256 = Key::rsa("rsa", Algorithm::PS256, None);
    // The same 2048-bit key published for encryption only.
    let oaep = Key::rsa("enc1", Algorithm::RS256, Some("RSA-OAEP"));
    let small = rsa_fixture(1024);
    let jwks = Jwks::serve(&[]);
    jwks.publish_raw(json!({"keys": [
        k1.jwk, rs256.jwk, oaep.jwk,
        {"kty": "RSA", "n": small["n"], "e": small["e"], "kid": "small"},
        // A key this server cannot read costs only itself.
        {"kty": "XYZ", "kid": "odd", "alg": "XYZ-1"},
    ]}));
    let server = start_oauth(
        &env,
        &jwks,
        &["--oauth-audience", audience, "--oauth-jwks-cooldown", "0"],
    );
    let good = claims(audience, "alice", "");
    let cases: Vec<(String, u16, &str)> = vec![
        (rs256.sign(&good), 200, ""),
        (ps256.sign(&good), 200, ""),
        (oaep.sign(&good), 401, "unknown_key"),
        (
            small["token"].as_str().unwrap().to_owned(),
            401,
            "unknown_key",
        ),
        (k1.sign_typed(&good, None), 200, ""),
        (k1.sign_typed(&good, Some("at+jwt")), 200, ""),
        (k1.sign_typed(&good, Some("application/at+jwt")), 200, ""),
        (
            k1.sign_typed(&good, Some("dpop+jwt")),
            401,
            "wrong_token_type",
        ),
        (
            k1.sign_typed(&good, Some("logout+jwt")),
            401,
            "wrong_token_type",
        ),
    ];
    for ((token, status, code), id) in cases.iter().zip(1u64..) {
        let (got, reply) = server.call(token, id, "tools/list", json!({}));
        assert_eq!(got, *status, "case {id}: {reply}");
        if *status != 200 {
            assert_eq!(reply["error"], json!(code), "case {id}: {reply}");
        }
    }
    drop(server);

    // For an issuer that types its access tokens: `at+jwt` only.
    let server = start_oauth(
        &env,
        &jwks,
        &["--oauth-audience", audience, "--oauth-require-at-jwt"],
    );
    for (typ, status) in [(Some("at+jwt"), 200), (Some("JWT"), 401), (None, 401)] {
        let (got, reply) = server.call(&k1.sign_typed(&good, typ), 30, "tools/list", json!({}));
        assert_eq!(got, status, "{typ:?}: {reply}");
        if status == 401 {
            assert_eq!(reply["error"], json!("wrong_token_type"), "{reply}");
        }
    }
}

#[test]
fn identities_of_two_authorities_or_two_tenants_never_share_exactly_once_records() {
    use issuer::{Jwks, Key, claims};

    let env = TestEnv::new();
    let k1 = Key::ed25519("k1");
    let jwks = Jwks::serve(&[&k1]);
    let api = create_token(&env, "alice", &[]);
    let api_acme = create_token(&env, "alice", &["--tenant", "acme"]);
    let api_globex = create_token(&env, "alice", &["--tenant", "globex"]);
    let note = env.note_path("req-ident-0001");
    // Each identity in turn writes the same note under the same key, and the note is removed
    // after each: an identity that shared an earlier one's record would get that record's
    // replay, and the note would stay gone.
    let write_each = |server: &HttpServer, tokens: &[&str]| {
        for (token, id) in tokens.iter().zip(1u64..) {
            let (_, reply) = server.call(token, id, "tools/call", note_call("req-ident-0001"));
            assert_eq!(status_of(&reply), "committed", "identity {id}: {reply}");
            assert!(note.exists(), "identity {id}: the effect ran");
            std::fs::remove_file(&note).unwrap();
        }
    };
    let token_of = |server: &HttpServer, org: Option<&str>| {
        let mut claims = claims(
            &format!("http://127.0.0.1:{}/mcp", server.port),
            "alice",
            "",
        );
        if let Some(org) = org {
            claims["org"] = json!(org);
        }
        k1.sign(&claims)
    };

    // The ledger's alice, alice of two tenants, and the issuer's alice.
    let server = start_oauth(&env, &jwks, &[]);
    let oauth = token_of(&server, None);
    write_each(&server, &[&api, &api_acme, &api_globex, &oauth]);
    drop(server);

    // One user of the issuer in two organisations.
    let orgs = ["--oauth-tenant-claim", "org"];
    let server = start_oauth(&env, &jwks, &orgs);
    let (oauth_acme, oauth_globex) = (
        token_of(&server, Some("acme")),
        token_of(&server, Some("globex")),
    );
    write_each(&server, &[&oauth_acme, &oauth_globex]);
    // Within one identity the record answers: a replay, and the effect does not run again.
    let (_, reply) = server.call(&oauth_globex, 9, "tools/call", note_call("req-ident-0001"));
    assert_eq!(status_of(&reply), "replay");
    assert!(!note.exists());
    drop(server);

    // Mapped explicitly, the issuer's alice is the ledger's: in org acme, the identity of the
    // API token of alice in tenant acme, whose record answers.
    let server = start_oauth(
        &env,
        &jwks,
        &[orgs[0], orgs[1], "--oauth-local-principal", "alice=alice"],
    );
    let mapped = token_of(&server, Some("acme"));
    let (_, reply) = server.call(&mapped, 10, "tools/call", note_call("req-ident-0001"));
    assert_eq!(status_of(&reply), "replay");
    assert!(!note.exists());
    drop(server);

    let records = env.audit_records();
    let writes: Vec<(&str, &str)> = records
        .iter()
        .filter(|r| r["name"] == "write_note")
        .map(|r| {
            (
                r["principal"].as_str().unwrap(),
                r["outcome"].as_str().unwrap(),
            )
        })
        .collect();
    let issued = |key: &str| format!("{}#{key}", issuer::ISSUER);
    assert_eq!(
        writes,
        [
            ("alice", "committed"),
            ("acme/alice", "committed"),
            ("globex/alice", "committed"),
            (issued("alice").as_str(), "committed"),
            (issued("acme/alice").as_str(), "committed"),
            (issued("globex/alice").as_str(), "committed"),
            (issued("globex/alice").as_str(), "replay"),
            ("acme/alice", "replay"),
        ]
    );
    assert!(env.audit_verify().status.success());
}

/// The preview of a call that needs confirmation.
fn preview_of(reply: &Value) -> Value {
    let text = reply["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("{reply}"));
    let preview: Value = serde_json::from_str(text).unwrap_or_else(|_| panic!("{reply}"));
    assert!(preview["confirm_token"].is_string(), "{reply}");
    preview
}

#[test]
fn a_confirmation_token_belongs_to_the_whole_identity_that_got_it() {
    let env = TestEnv::new();
    std::fs::copy(
        format!(
            "{}/../../fixtures/policy-http-confirm.json",
            env!("CARGO_MANIFEST_DIR")
        ),
        &env.policy,
    )
    .unwrap();
    let acme = create_token(&env, "alice", &["--tenant", "acme"]);
    let globex = create_token(&env, "alice", &["--tenant", "globex"]);
    let server = HttpServer::start(&env);
    let (_, reply) = server.call(&acme, 1, "tools/call", note_call("req-confirm-0001"));
    let preview = preview_of(&reply);
    let confirm = json!({"name": "confirm_action", "arguments": {
        "confirm_token": preview["confirm_token"],
        "confirm_summary": preview["confirm_summary"]}});
    // Alice of another tenant cannot confirm it: nothing runs, the token is not spent.
    let (status, reply) = server.call(&globex, 2, "tools/call", confirm.clone());
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["result"]["isError"], json!(true), "{reply}");
    assert_eq!(
        reply["result"]["structuredContent"]["error"],
        json!("token_foreign"),
        "{reply}"
    );
    assert!(!env.note_path("req-confirm-0001").exists());
    let (_, reply) = server.call(&acme, 3, "tools/call", confirm);
    assert_eq!(status_of(&reply), "committed");
    assert!(env.note_path("req-confirm-0001").exists());
}

#[test]
fn rate_buckets_belong_to_whole_identities() {
    let env = TestEnv::new();
    let mut policy: Value =
        serde_json::from_str(&std::fs::read_to_string(&env.policy).unwrap()).unwrap();
    let one = json!({"burst": 1, "per_minute": 1});
    policy["rate_limits"] = json!({"principals": {"acme/alice": one, "globex/alice": one}});
    std::fs::write(&env.policy, policy.to_string()).unwrap();
    let acme = create_token(&env, "alice", &["--tenant", "acme"]);
    let globex = create_token(&env, "alice", &["--tenant", "globex"]);
    let server = HttpServer::start(&env);
    let (_, reply) = server.call(&acme, 1, "tools/call", note_call("req-rate-0001"));
    assert_eq!(status_of(&reply), "committed");
    let (_, reply) = server.call(&acme, 2, "tools/call", note_call("req-rate-0002"));
    assert_eq!(reply["result"]["isError"], json!(true), "{reply}");
    assert!(
        reply
            .to_string()
            .contains("rate_limits.principals.acme/alice"),
        "{reply}"
    );
    assert!(!env.note_path("req-rate-0002").exists());
    // Alice of globex has her own bucket, still full.
    let (_, reply) = server.call(&globex, 3, "tools/call", note_call("req-rate-0003"));
    assert_eq!(status_of(&reply), "committed");
}

#[test]
fn rights_belong_to_whole_identities() {
    use issuer::{Jwks, Key, claims};

    let env = TestEnv::new();
    let rights = env.path("rights.json");
    std::fs::write(
        &rights,
        json!({"version": 1, "principals": {
            "acme/alice": {"tools": ["write_note", "read_ledger"]},
            "globex/alice": {"tools": ["read_ledger"]},
            format!("{}#alice", issuer::ISSUER): {"tools": ["read_ledger"]},
        }})
        .to_string(),
    )
    .unwrap();
    let acme = create_token(&env, "alice", &["--tenant", "acme"]);
    let globex = create_token(&env, "alice", &["--tenant", "globex"]);
    let local = create_token(&env, "alice", &[]);
    let k1 = Key::ed25519("k1");
    let jwks = Jwks::serve(&[&k1]);
    let rights_arg = rights.to_str().unwrap();
    let server = start_oauth(&env, &jwks, &["--rights", rights_arg]);
    let oauth = k1.sign(&claims(
        &format!("http://127.0.0.1:{}/mcp", server.port),
        "alice",
        "",
    ));
    let (_, listed) = server.call(&acme, 1, "tools/list", json!({}));
    assert!(listed_names(&listed).contains(&"write_note".to_owned()));
    for (token, id) in [(&globex, 2), (&oauth, 3)] {
        let (_, listed) = server.call(token, id, "tools/list", json!({}));
        let names = listed_names(&listed);
        assert!(
            !names.contains(&"write_note".to_owned()) && names.contains(&"read_ledger".to_owned()),
            "{id}: {names:?}"
        );
        let (_, refused) = server.call(token, id + 10, "tools/call", note_call("req-rights-0009"));
        assert_eq!(refused["error"]["code"], json!(-32602), "{refused}");
    }
    // The ledger's alice without a tenant is in no entry: no rights at all.
    let (_, listed) = server.call(&local, 4, "tools/list", json!({}));
    assert_eq!(listed_names(&listed), Vec::<String>::new());
    assert!(!env.note_path("req-rights-0009").exists());
    let (_, reply) = server.call(&acme, 5, "tools/call", note_call("req-rights-0009"));
    assert_eq!(status_of(&reply), "committed");
}

#[test]
fn tenants_scopes_and_clients_of_api_tokens_reach_the_audit_log() {
    let env = TestEnv::new();
    scoped_policy(&env);
    let alice = create_token(
        &env,
        "alice",
        &["--tenant", "acme", "--scope", "notes:write"],
    );
    let reader = create_token(
        &env,
        "bob",
        &["--tenant", "globex", "--scope", "notes:read"],
    );
    let refused = common::run_to_end({
        let mut command = env.command();
        command.args(["token", "create", "--principal", "x", "--scope", "a b"]);
        command
    });
    assert_eq!(refused.status.code(), Some(2), "{}", output_text(&refused));
    assert!(output_text(&refused).contains("invalid scope"));
    let server = HttpServer::start(&env);

    // The client's declared name and version travel in `_meta` (2026-07-28).
    let mut call = note_call("req-tenant-0001");
    call["_meta"] =
        json!({"io.modelcontextprotocol/clientInfo": {"name": "probe", "version": "9.1"}});
    let (_, reply) = server.call(&alice, 1, "tools/call", call);
    assert_eq!(status_of(&reply), "committed");
    let (status, reply) = server.call(&reader, 2, "tools/call", note_call("req-tenant-0002"));
    assert_eq!(status, 403, "{reply}");
    assert_eq!(reply["error"], json!("insufficient_scope"));
    // The tenant comes from the credential only: an argument naming one is refused as unknown.
    for field in ["tenant", "workspace_id"] {
        let mut call = note_call("req-tenant-0003");
        call["arguments"][field] = json!("globex");
        let (status, reply) = server.call(&alice, 3, "tools/call", call);
        assert_eq!(status, 200, "{reply}");
        assert_eq!(reply["result"]["isError"], json!(true), "{reply}");
        assert!(reply.to_string().contains(field), "{reply}");
    }
    assert!(!env.note_path("req-tenant-0003").exists());
    drop(server);

    let records = env.audit_records();
    let write = records
        .iter()
        .find(|r| r["name"] == "write_note" && r["decision"] == "allow")
        .unwrap();
    assert_eq!(
        (
            &write["principal"],
            &write["tenant"],
            &write["channel"],
            &write["client_name"],
            &write["client_version"]
        ),
        (
            &json!("acme/alice"),
            &json!("acme"),
            &json!("http"),
            &json!("probe"),
            &json!("9.1")
        ),
        "{write}"
    );
    let denied = records
        .iter()
        .find(|r| r["reason"] == "insufficient_scope")
        .unwrap();
    assert_eq!(
        (&denied["principal"], &denied["tenant"]),
        (&json!("globex/bob"), &json!("globex"))
    );
    assert!(env.audit_verify().status.success());
}

#[test]
fn the_kill_switch_answers_503_with_retry_after_and_the_connection_stays_usable() {
    let env = TestEnv::new();
    let alice = create_token(&env, "alice", &[]);
    let server = HttpServer::start(&env);
    operator(&env, &["halt", "--reason", "maintenance", "--by", "ops"]);
    let (status, headers, body) = {
        let auth = format!("Bearer {alice}");
        let mut params = note_call("req-halt-0001");
        params["_meta"] = json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {}});
        server.post(
            &[
                ("Authorization", &auth),
                ("MCP-Protocol-Version", "2026-07-28"),
                ("Mcp-Method", "tools/call"),
                ("Mcp-Name", "write_note"),
            ],
            &json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": params}),
        )
    };
    assert_eq!(status, 503, "{body}");
    assert_eq!(header(&headers, "retry-after"), Some("30"));
    let reply: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(reply["id"], json!(7), "{reply}");
    assert!(
        reply["error"]["message"]
            .as_str()
            .unwrap()
            .contains("maintenance"),
        "{reply}"
    );
    assert!(!env.note_path("req-halt-0001").exists());
    // Exempt reads and lists keep working; after resume the call goes through.
    let (status, reply) = server.call(
        &alice,
        8,
        "tools/call",
        json!({"name": "read_ledger", "arguments": {}}),
    );
    assert_eq!(status, 200, "{reply}");
    operator(&env, &["resume"]);
    let (_, reply) = server.call(&alice, 9, "tools/call", note_call("req-halt-0001"));
    assert_eq!(status_of(&reply), "committed");

    // A tenant's switch stops that tenant's principals only.
    let acme = create_token(&env, "carol", &["--tenant", "acme"]);
    let globex = create_token(&env, "dave", &["--tenant", "globex"]);
    operator(
        &env,
        &["halt", "--tenant", "acme", "--reason", "acme incident"],
    );
    let (status, reply) = server.call(&acme, 10, "tools/call", note_call("req-halt-0002"));
    assert_eq!(status, 503, "{reply}");
    assert!(
        reply["error"]["message"]
            .as_str()
            .unwrap()
            .contains("acme incident")
    );
    let (_, reply) = server.call(&globex, 11, "tools/call", note_call("req-halt-0003"));
    assert_eq!(status_of(&reply), "committed");
    let (_, reply) = server.call(&alice, 12, "tools/call", note_call("req-halt-0004"));
    assert_eq!(status_of(&reply), "committed");
    operator(&env, &["resume", "--tenant", "acme"]);
    let (_, reply) = server.call(&acme, 13, "tools/call", note_call("req-halt-0002"));
    assert_eq!(status_of(&reply), "committed");
    drop(server);
    let records = env.audit_records();
    assert!(
        records
            .iter()
            .any(|r| r["reason"] == "kill_switch" && r["principal"] == "alice"),
        "the 503 is audited"
    );
    let tenant_halts: Vec<(&Value, &Value)> = records
        .iter()
        .filter(|r| r["tenant"] == "acme")
        .map(|r| (&r["method"], &r["outcome"]))
        .collect();
    assert_eq!(
        tenant_halts,
        [
            (&json!("admin/halt"), &json!("halted")),
            (&json!("tools/call"), &json!("not_executed")),
            (&json!("admin/resume"), &json!("resumed")),
            (&json!("tools/call"), &json!("committed")),
        ]
    );
    assert!(env.audit_verify().status.success());
}

#[test]
fn slow_clients_are_cut_off() {
    let env = TestEnv::new();
    let alice = create_token(&env, "alice", &[]);
    let server = HttpServer::start_with(&env, &["--header-timeout", "1", "--request-timeout", "1"]);
    let connect = || {
        let stream = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(120)))
            .unwrap();
        stream
    };
    // Headers that never end: the connection is closed (no request reaches the gate).
    let mut stream = connect();
    stream
        .write_all(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        .unwrap();
    let mut rest = Vec::new();
    let read = stream.read_to_end(&mut rest);
    assert!(read.is_ok(), "the server closes the connection: {read:?}");
    // A body that never ends: 503 once the request deadline passes.
    let mut stream = connect();
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nAuthorization: Bearer {alice}\r\n\
         Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n\
         Content-Length: 1000\r\n\r\n{{\"jsonrpc\":",
        server.port
    );
    stream.write_all(head.as_bytes()).unwrap();
    let mut reply = [0u8; 512];
    let n = stream.read(&mut reply).unwrap();
    let reply = String::from_utf8_lossy(&reply[..n]);
    assert!(reply.starts_with("HTTP/1.1 503"), "{reply}");
    // The server still serves.
    let (status, reply) = server.call(&alice, 1, "tools/list", json!({}));
    assert_eq!(status, 200, "{reply}");
}

#[test]
fn two_principals_with_different_rights_share_one_server() {
    let env = TestEnv::new();
    // The top level lets everyone read; only alice's section adds the write.
    let mut policy: Value =
        serde_json::from_str(&std::fs::read_to_string(&env.policy).unwrap()).unwrap();
    policy["allow"] = json!(["read_ledger"]);
    policy["principals"] = json!({"alice": {"allow": ["write_note"]}});
    std::fs::write(&env.policy, policy.to_string()).unwrap();
    let alice = create_token(&env, "alice", &[]);
    let bob = create_token(&env, "bob", &[]);
    let server = HttpServer::start(&env);

    let (_, listed) = server.call(&alice, 1, "tools/list", json!({}));
    assert!(listed_names(&listed).contains(&"write_note".to_owned()));
    let (_, listed) = server.call(&bob, 2, "tools/list", json!({}));
    let names = listed_names(&listed);
    assert!(
        !names.contains(&"write_note".to_owned()) && names.contains(&"read_ledger".to_owned()),
        "{names:?}"
    );
    let (_, first) = server.call(&alice, 3, "tools/call", note_call("req-rights-0001"));
    assert_eq!(status_of(&first), "committed");
    let (_, again) = server.call(&alice, 4, "tools/call", note_call("req-rights-0001"));
    assert_eq!(status_of(&again), "replay");
    // Bob's call of the tool he may not see: refused before any handler code runs.
    let (status, refused) = server.call(&bob, 5, "tools/call", note_call("req-rights-0002"));
    assert_eq!(status, 200, "{refused}");
    assert_eq!(refused["error"]["code"], json!(-32602), "{refused}");
    assert!(!env.note_path("req-rights-0002").exists());
    let (_, read) = server.call(
        &bob,
        6,
        "tools/call",
        json!({"name": "read_ledger", "arguments": {}}),
    );
    assert_ne!(read["result"]["isError"], json!(true), "{read}");
    drop(server);

    let records = env.audit_records();
    let calls: Vec<(&str, &str, &str)> = records
        .iter()
        .filter(|r| r["method"] == "tools/call")
        .map(|r| {
            (
                r["principal"].as_str().unwrap(),
                r["name"].as_str().unwrap(),
                r["outcome"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        calls,
        [
            ("alice", "write_note", "committed"),
            ("alice", "write_note", "replay"),
            ("bob", "write_note", "not_executed"),
            ("bob", "read_ledger", "observed"),
        ]
    );
}

#[test]
fn origins_and_hosts_come_from_configuration() {
    let env = TestEnv::new();
    let alice = create_token(&env, "alice", &[]);
    let server = HttpServer::start_with(
        &env,
        &[
            "--allowed-origin",
            "https://app.example",
            "--allowed-host",
            "mcp.example",
        ],
    );
    let auth = format!("Bearer {alice}");
    let list = |origin: &str| {
        server.post(
            &[
                ("Authorization", &auth),
                ("MCP-Protocol-Version", "2026-07-28"),
                ("Mcp-Method", "tools/list"),
                ("Origin", origin),
            ],
            &json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": {
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientCapabilities": {}}}}),
        )
    };
    let (status, _, body) = list("https://app.example");
    assert_eq!(status, 200, "{body}");
    // The configured list replaces the loopback default.
    let (status, _, body) = list("http://127.0.0.1:9");
    assert_eq!(status, 403, "{body}");
    // A Host outside the allow-list is refused; a configured one is served.
    let raw = |host: &str| {
        let body = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {"_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {}}}})
        .to_string();
        server.exchange(&format!(
            "POST /mcp HTTP/1.1\r\nHost: {host}\r\nAuthorization: {auth}\r\nContent-Type: application/json\r\n\
             Accept: application/json, text/event-stream\r\nMCP-Protocol-Version: 2026-07-28\r\n\
             Mcp-Method: tools/list\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        ))
    };
    let (status, _, body) = raw("evil.example");
    assert!(status == 403 || status == 400, "{status} {body}");
    let (status, _, body) = raw("mcp.example");
    assert_eq!(status, 200, "{body}");
}

// --- The transport's checks (issue 30) -----------------------------------------------------------

/// A `tools/list` of the 2026-07-28 flow: its body and its MCP headers (without credential).
fn list_request(id: u64) -> (Value, [(&'static str, &'static str); 2]) {
    (
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/list", "params": {"_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {}}}}),
        [
            ("MCP-Protocol-Version", "2026-07-28"),
            ("Mcp-Method", "tools/list"),
        ],
    )
}

/// The reasons of the audit records of `method`, in order.
fn reasons<'a>(records: &'a [Value], method: &str) -> Vec<&'a str> {
    records
        .iter()
        .filter(|r| r["method"] == method)
        .map(|r| r["reason"].as_str().unwrap())
        .collect()
}

#[test]
fn origin_and_host_are_checked_before_the_credential() {
    let env = TestEnv::new();
    let alice = create_token(&env, "alice", &[]);
    let server = HttpServer::start(&env);
    let auth = format!("Bearer {alice}");
    let (body, mcp) = list_request(1);
    let with = |extra: &[(&str, &str)]| {
        let mut headers: Vec<(&str, &str)> = mcp.to_vec();
        headers.extend_from_slice(extra);
        server.post(&headers, &body)
    };

    // A foreign Origin without a token: 403, no challenge (the transport refuses first).
    let (status, headers, reply) = with(&[("Origin", "http://evil.example")]);
    assert_eq!(status, 403, "{reply}");
    assert!(
        header(&headers, "www-authenticate").is_none(),
        "{headers:?}"
    );
    // Userinfo in the Origin, a second Origin after a good one: 403 even with a valid token.
    for origins in [
        &[("Origin", "http://evil.example@127.0.0.1")][..],
        &[
            ("Origin", "http://127.0.0.1:1"),
            ("Origin", "http://evil.example"),
        ][..],
        &[("Origin", "http://127.0.0.1:1/path")][..],
    ] {
        let mut extra = vec![("Authorization", auth.as_str())];
        extra.extend_from_slice(origins);
        let (status, _, reply) = with(&extra);
        assert_eq!(status, 403, "{origins:?}: {reply}");
    }
    // A good Origin with the token: served.
    let (status, _, reply) = with(&[("Authorization", &auth), ("Origin", "http://127.0.0.1:1")]);
    assert_eq!(status, 200, "{reply}");

    // Hosts: empty, foreign, with userinfo, twice; refused without and with a token.
    let raw = body.to_string();
    for (hosts, expected) in [
        (&[""][..], 400),
        (&["evil.example"][..], 403),
        (&["alice@127.0.0.1"][..], 400),
        (&["127.0.0.1", "evil.example"][..], 400),
    ] {
        for token in [None, Some(auth.as_str())] {
            let mut headers: Vec<(&str, &str)> = hosts.iter().map(|h| ("Host", *h)).collect();
            headers.extend_from_slice(&[
                ("Content-Type", "application/json"),
                ("Accept", "application/json, text/event-stream"),
            ]);
            headers.extend_from_slice(&mcp);
            headers.extend(token.map(|auth| ("Authorization", auth)));
            let (status, headers, reply) = server.send("POST", &headers, raw.as_bytes());
            // hyper itself may refuse a request with two Host headers (400) before the router.
            assert_eq!(status, expected, "{hosts:?} {token:?}: {reply}");
            assert!(
                header(&headers, "www-authenticate").is_none(),
                "{headers:?}"
            );
        }
    }
    drop(server);

    let records = env.audit_records();
    let transport = reasons(&records, "http/transport");
    assert_eq!(
        transport
            .iter()
            .filter(|r| **r == "origin_not_allowed")
            .count(),
        1,
        "{transport:?}"
    );
    assert_eq!(
        transport.iter().filter(|r| **r == "invalid_origin").count(),
        3,
        "{transport:?}"
    );
    assert!(
        transport
            .iter()
            .filter(|r| **r == "host_not_allowed")
            .count()
            == 2
            && transport.iter().filter(|r| **r == "invalid_host").count() >= 4,
        "{transport:?}"
    );
    // The refusals came before authentication: none of them is an authentication refusal.
    assert!(reasons(&records, "http/authenticate").is_empty());
    // No raw header value in the log: only digests.
    let audit = env.audit_text();
    assert!(!audit.contains("evil.example") && !audit.contains(&alice));
    assert!(env.audit_verify().status.success());
}

#[test]
fn malformed_bodies_get_400_with_a_json_rpc_error_and_nothing_internal() {
    let env = TestEnv::new();
    let alice = create_token(&env, "alice", &[]);
    let server = HttpServer::start(&env);
    let auth = format!("Bearer {alice}");
    let host = format!("127.0.0.1:{}", server.port);
    let headers = [
        ("Host", host.as_str()),
        ("Authorization", auth.as_str()),
        ("Content-Type", "application/json"),
        ("Accept", "application/json, text/event-stream"),
        ("MCP-Protocol-Version", "2026-07-28"),
        ("Mcp-Method", "tools/list"),
    ];
    let batch = json!([{"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}])
    .to_string();
    for (body, code) in [
        ("{not json", -32700),
        ("", -32700),
        ("{\"jsonrpc\": \"2.0\", \"id\": 1, \"method\": ", -32700),
        (batch.as_str(), -32600),
        ("{}", -32600),
        ("\"tools/list\"", -32600),
        ("{\"jsonrpc\": \"2.0\", \"id\": 1}", -32600),
    ] {
        let (status, headers, reply) = server.send("POST", &headers, body.as_bytes());
        assert_eq!(status, 400, "{body:?}: {reply}");
        assert!(
            header(&headers, "content-type").is_some_and(|t| t.starts_with("application/json")),
            "{headers:?}"
        );
        let reply: Value = serde_json::from_str(&reply).unwrap_or_else(|_| panic!("{reply}"));
        assert_eq!(reply["jsonrpc"], json!("2.0"), "{reply}");
        assert_eq!(reply["error"]["code"], json!(code), "{body:?}: {reply}");
        let message = reply["error"]["message"].as_str().unwrap();
        // The deserializer's own words ("expected value at line 1 column 2") stay inside.
        assert!(
            !message.contains("line")
                && !message.contains("column")
                && !message.contains("expected"),
            "{message}"
        );
    }
    // Not JSON at all: 415, audited.
    let mut text = headers.to_vec();
    text[2] = ("Content-Type", "text/plain");
    let (status, _, reply) = server.send("POST", &text, b"{}");
    assert_eq!(status, 415, "{reply}");
    // A message whose Mcp-Method disagrees with the body: rmcp's 400 / -32020, audited.
    let (body, _) = list_request(9);
    let (status, _, reply) = server.post(
        &[
            ("Authorization", &auth),
            ("MCP-Protocol-Version", "2026-07-28"),
            ("Mcp-Method", "tools/call"),
        ],
        &body,
    );
    assert_eq!(status, 400, "{reply}");
    assert!(reply.contains("-32020"), "{reply}");
    // A well-formed message is still served.
    let (status, reply) = server.call(&alice, 10, "tools/list", json!({}));
    assert_eq!(status, 200, "{reply}");
    drop(server);

    let records = env.audit_records();
    let transport = reasons(&records, "http/transport");
    assert_eq!(
        transport,
        [
            "parse_error",
            "parse_error",
            "parse_error",
            "batch_not_supported",
            "invalid_message",
            "invalid_message",
            "invalid_message",
            "unsupported_media_type",
            "header_mismatch"
        ]
    );
    assert!(
        records
            .iter()
            .filter(|r| r["method"] == "http/transport")
            .all(|r| r["principal"] == "alice" && r["channel"] == "http"),
        "{records:?}"
    );
    assert!(env.audit_verify().status.success());
}

#[test]
fn a_declared_body_over_the_limit_is_refused_before_it_is_read() {
    let env = TestEnv::new();
    let alice = create_token(&env, "alice", &[]);
    // Without the check the server would wait for the 64 MiB body until this timeout (longer
    // than the test's read timeout, 120 s), so the test would fail rather than pass slowly.
    let server = HttpServer::start_with(&env, &["--request-timeout", "3600"]);
    let auth = format!("Bearer {alice}");
    let host = format!("127.0.0.1:{}", server.port);
    let headers = [
        ("Host", host.as_str()),
        ("Authorization", auth.as_str()),
        ("Content-Type", "application/json"),
        ("Accept", "application/json, text/event-stream"),
        ("Content-Length", "67108864"),
    ];
    let (status, _, reply) = server.send("POST", &headers, b"");
    assert_eq!(status, 413, "{reply}");
    assert!(reply.contains("body_too_large"), "{reply}");
    drop(server);
    assert_eq!(
        reasons(&env.audit_records(), "http/transport"),
        ["body_too_large"]
    );
}

#[test]
fn ambiguous_credentials_are_refused() {
    let env = TestEnv::new();
    let alice = create_token(&env, "alice", &[]);
    let server = HttpServer::start(&env);
    let good = format!("Bearer {alice}");
    let bad = format!("Bearer tgt_{}", "0".repeat(64));
    let (body, mcp) = list_request(1);
    for pair in [[&good, &bad], [&bad, &good], [&good, &good]] {
        let mut headers: Vec<(&str, &str)> = mcp.to_vec();
        headers.extend(pair.iter().map(|auth| ("Authorization", auth.as_str())));
        let (status, headers, reply) = server.post(&headers, &body);
        assert_eq!(status, 400, "{reply}");
        assert!(reply.contains("multiple_credentials"), "{reply}");
        let challenge = header(&headers, "www-authenticate").unwrap_or_default();
        assert!(
            challenge.contains("error=\"invalid_request\""),
            "{challenge}"
        );
    }
    let (status, reply) = server.call(&alice, 2, "tools/list", json!({}));
    assert_eq!(status, 200, "{reply}");
    drop(server);
    assert_eq!(
        reasons(&env.audit_records(), "http/authenticate"),
        ["multiple_credentials"; 3]
    );
}

#[test]
fn a_flood_of_refusals_is_audited_within_the_bound_and_calls_go_on() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    const LIMIT: usize = 5;
    const FLOOD: usize = 60;
    let env = TestEnv::new();
    let alice = create_token(&env, "alice", &[]);
    let started = std::time::Instant::now();
    let mut server = HttpServer::start_with(&env, &["--refusal-audit-limit", &LIMIT.to_string()]);
    let server_ref = &server;
    let sent = Arc::new(AtomicUsize::new(0));
    let (body, mcp) = list_request(1);
    std::thread::scope(|scope| {
        for flooder in 0..3 {
            let (sent, body) = (Arc::clone(&sent), body.clone());
            scope.spawn(move || {
                for i in 0..FLOOD / 3 {
                    let origin = format!("http://evil{flooder}-{i}.example");
                    let mut headers: Vec<(&str, &str)> = mcp.to_vec();
                    headers.push(("Origin", &origin));
                    let (status, _, reply) = server_ref.post(&headers, &body);
                    assert_eq!(status, 403, "{reply}");
                    sent.fetch_add(1, Ordering::SeqCst);
                }
            });
        }
        // A legitimate call in the middle of the flood is served and audited.
        while sent.load(Ordering::SeqCst) < FLOOD / 4 {
            common::poll_pause();
        }
        let (_, reply) = server_ref.call(&alice, 2, "tools/call", note_call("req-flood-0001"));
        assert_eq!(status_of(&reply), "committed");
    });
    // A clean stop writes the count of the window still open.
    let pid = server.child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let status = common::wait_exit(&mut server.child, Duration::from_secs(120))
        .expect("the server stops on SIGTERM");
    assert!(status.success(), "{status:?}");
    let elapsed = started.elapsed();

    let records = env.audit_records();
    let individual = reasons(&records, "http/transport").len();
    let counted: usize = reasons(&records, "http/refusals")
        .iter()
        .map(|reason| reason.split(' ').next().unwrap().parse::<usize>().unwrap())
        .sum();
    // Every refusal is accounted for, once: written alone or counted in a summary.
    assert_eq!(individual + counted, FLOOD, "{records:?}");
    // At most LIMIT records per minute-long window (the flood spans one, or a few on a machine
    // slow enough to cross window boundaries).
    let windows = usize::try_from(elapsed.as_secs() / 60).unwrap() + 2;
    assert!(
        individual >= LIMIT && individual <= LIMIT * windows,
        "{individual} records in {windows} windows"
    );
    assert!(counted > 0);
    assert!(
        records
            .iter()
            .any(|r| r["name"] == "write_note" && r["outcome"] == "committed")
    );
    assert!(env.audit_verify().status.success());
}

#[test]
fn a_session_is_bound_to_the_whole_identity_and_a_refused_delete_keeps_it() {
    let env = TestEnv::new();
    let acme = create_token(&env, "alice", &["--tenant", "acme"]);
    let globex = create_token(&env, "alice", &["--tenant", "globex"]);
    let bob = create_token(&env, "bob", &[]);
    let server = HttpServer::start(&env);
    let host = format!("127.0.0.1:{}", server.port);
    let bearer = |token: &str| format!("Bearer {token}");
    let (status, headers, body) = server.post(
        &[("Authorization", &bearer(&acme))],
        &json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "http-test", "version": "1"}}}),
    );
    assert_eq!(status, 200, "{body}");
    let session = header(&headers, "mcp-session-id").unwrap().to_owned();
    let on = |token: &str, session: &str, version: &str, method: &str| {
        let auth = bearer(token);
        let headers = [
            ("Host", host.as_str()),
            ("Authorization", auth.as_str()),
            ("Content-Type", "application/json"),
            ("Accept", "application/json, text/event-stream"),
            ("Mcp-Session-Id", session),
            ("MCP-Protocol-Version", version),
        ];
        let body = if method == "POST" {
            json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}).to_string()
        } else {
            String::new()
        };
        let (status, _, reply) = server.send(method, &headers, body.as_bytes());
        (status, reply)
    };
    let (status, _, reply) = server.post(
        &[
            ("Authorization", &bearer(&acme)),
            ("Mcp-Session-Id", &session),
            ("MCP-Protocol-Version", "2025-11-25"),
        ],
        &json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    );
    assert!(status == 202 || status == 200, "{status} {reply}");
    let (status, reply) = on(&acme, &session, "2025-11-25", "POST");
    assert_eq!(status, 200, "{reply}");
    // alice's DELETE with a bad protocol version is refused, and the session stays hers.
    let (status, reply) = on(&acme, &session, "1999-01-01", "DELETE");
    assert_eq!(status, 400, "{reply}");
    let (status, reply) = on(&bob, &session, "2025-11-25", "POST");
    assert_eq!(status, 404, "bob reached alice's session: {reply}");
    // The same name in another tenant is another identity.
    let (status, reply) = on(&globex, &session, "2025-11-25", "POST");
    assert_eq!(
        status, 404,
        "alice of globex reached alice of acme's session: {reply}"
    );
    let (status, reply) = on(&acme, &session, "2025-11-25", "POST");
    assert_eq!(status, 200, "{reply}");
    // A session id nobody opened: 404.
    let (status, reply) = on(&bob, "not-a-session", "2025-11-25", "POST");
    assert_eq!(status, 404, "{reply}");
    // alice's accepted DELETE ends it for everyone.
    let (status, reply) = on(&acme, &session, "2025-11-25", "DELETE");
    assert!((200..300).contains(&status), "{status} {reply}");
    for token in [&acme, &bob] {
        let (status, reply) = on(token, &session, "2025-11-25", "POST");
        assert_eq!(status, 404, "{reply}");
    }
    drop(server);
    // The refused DELETE was audited.
    assert_eq!(
        reasons(&env.audit_records(), "http/transport"),
        ["bad_request"]
    );
}

/// Cedar policies over HTTP: roles and tenants from API tokens (`--attr role=…`) and from OAuth
/// claims (`--oauth-roles-claim`), on one server; lists, calls and refusals follow the Cedar
/// policy, a tenant never reaches another tenant's tool, and the audit names the determining
/// policies.
#[cfg(feature = "cedar")]
#[test]
fn cedar_roles_and_tenants_from_tokens_decide_lists_and_calls() {
    use issuer::{Jwks, Key, claims};

    let env = TestEnv::new();
    let mut policy: Value =
        serde_json::from_str(&std::fs::read_to_string(&env.policy).unwrap()).unwrap();
    policy["cedar"] = json!("roles.cedar");
    std::fs::write(&env.policy, policy.to_string()).unwrap();
    let cedar = r#"
@id("everyone-lists")
permit(principal, action == Toolgate::Action::"tools/list", resource);

@id("readers-read")
permit(principal in Toolgate::Role::"reader", action == Toolgate::Action::"read_ledger", resource);

@id("writers-write-approved")
permit(principal in Toolgate::Role::"writer", action == Toolgate::Action::"write_note", resource)
when { context.arguments.text like "ok*" };

// write_note belongs to tenant acme: no other tenant reaches it, whatever its roles.
@id("acme-only")
forbid(principal, action == Toolgate::Action::"write_note", resource)
unless { principal has tenant && principal.tenant == "acme" };
"#;
    std::fs::write(env.path("roles.cedar"), cedar).unwrap();
    let alice = create_token(
        &env,
        "alice",
        &[
            "--tenant",
            "acme",
            "--attr",
            "role=writer",
            "--attr",
            "role=reader",
        ],
    );
    let bob = create_token(&env, "bob", &["--tenant", "acme", "--attr", "role=reader"]);
    let carol = create_token(
        &env,
        "carol",
        &[
            "--tenant",
            "globex",
            "--attr",
            "role=writer",
            "--attr",
            "dept=sales",
        ],
    );
    // Malformed attributes create nothing.
    for bad in [
        ["--attr", "role"],
        ["--attr", "Dept=x"],
        ["--attr", "role=a b"],
    ] {
        let output = common::run_to_end({
            let mut command = env.command();
            command
                .args(["token", "create", "--principal", "dave"])
                .args(bad);
            command
        });
        assert!(!output.status.success(), "{bad:?}");
    }
    // `token list` shows what Cedar sees of each token.
    let listed = operator(&env, &["token", "list"]);
    let line = |who: &str| {
        listed
            .lines()
            .find(|l| l.contains(&format!(" {who} ")))
            .unwrap_or_else(|| panic!("no {who} in {listed}"))
            .to_owned()
    };
    assert!(
        line("alice").ends_with(" tenant=acme role=writer role=reader"),
        "{listed}"
    );
    assert!(
        line("carol").ends_with(" tenant=globex role=writer dept=sales"),
        "{listed}"
    );
    assert!(!listed.contains("dave"), "{listed}");
    let k1 = Key::ed25519("k1");
    let jwks = Jwks::serve(&[&k1]);
    let server = start_oauth(
        &env,
        &jwks,
        &[
            "--oauth-roles-claim",
            "roles",
            "--oauth-tenant-claim",
            "org",
        ],
    );
    let oauth = {
        let mut claims = claims(&format!("http://127.0.0.1:{}/mcp", server.port), "erin", "");
        claims["org"] = json!("acme");
        claims["roles"] = json!(["writer"]);
        k1.sign(&claims)
    };
    let write = |text: &str, id: &str| json!({"name": "write_note", "arguments": {"request_id": id, "text": text}});
    let listed = |token: &str, id: u64| {
        let (_, reply) = server.call(token, id, "tools/list", json!({}));
        let mut names = listed_names(&reply);
        names.sort();
        names
    };

    assert_eq!(listed(&alice, 1), ["read_ledger", "write_note"]);
    assert_eq!(listed(&bob, 2), ["read_ledger"]);
    assert_eq!(listed(&carol, 3), Vec::<String>::new());
    assert_eq!(listed(&oauth, 4), ["write_note"]);

    let (_, ok) = server.call(
        &alice,
        5,
        "tools/call",
        write("ok from alice", "req-cedar-0001"),
    );
    assert_eq!(status_of(&ok), "committed", "{ok}");
    let (_, refused) = server.call(
        &alice,
        6,
        "tools/call",
        write("unapproved", "req-cedar-0002"),
    );
    assert_eq!(refused["result"]["isError"], json!(true), "{refused}");
    assert_eq!(
        refused["result"]["structuredContent"]["rule"], "cedar",
        "{refused}"
    );
    assert!(!env.note_path("req-cedar-0002").exists());
    // A tool Cedar does not list is as unknown as a missing one, for a role or a tenant.
    for (token, id) in [(&bob, 7), (&carol, 8)] {
        let (status, hidden) = server.call(token, id, "tools/call", write("ok", "req-cedar-0003"));
        assert_eq!(status, 200, "{hidden}");
        assert_eq!(hidden["error"]["code"], json!(-32602), "{hidden}");
    }
    assert!(!env.note_path("req-cedar-0003").exists());
    let (_, ok) = server.call(
        &oauth,
        9,
        "tools/call",
        write("ok from erin", "req-cedar-0004"),
    );
    assert_eq!(status_of(&ok), "committed", "{ok}");
    let (_, read) = server.call(
        &bob,
        10,
        "tools/call",
        json!({"name": "read_ledger", "arguments": {}}),
    );
    assert_ne!(read["result"]["isError"], json!(true), "{read}");
    drop(server);

    let records = env.audit_records();
    let calls: Vec<(&str, &str, &str, Value)> = records
        .iter()
        .filter(|r| r["method"] == "tools/call")
        .map(|r| {
            (
                r["principal"].as_str().unwrap(),
                r["name"].as_str().unwrap(),
                r["reason"].as_str().unwrap_or(""),
                r["cedar_policies"].clone(),
            )
        })
        .collect();
    let erin = format!("{}#acme/erin", issuer::ISSUER);
    assert_eq!(
        calls,
        [
            (
                "acme/alice",
                "write_note",
                "allow",
                json!(["writers-write-approved"])
            ),
            ("acme/alice", "write_note", "cedar", json!([])),
            ("acme/bob", "write_note", "cedar.list", json!([])),
            (
                "globex/carol",
                "write_note",
                "cedar.list",
                json!(["acme-only"])
            ),
            (
                erin.as_str(),
                "write_note",
                "allow",
                json!(["writers-write-approved"])
            ),
            ("acme/bob", "read_ledger", "allow", json!(["readers-read"])),
        ]
    );
    let digest = common::sha256_hex(cedar.as_bytes());
    assert!(
        records
            .iter()
            .filter(|r| r["method"] == "tools/call")
            .all(|r| r["cedar_digest"] == digest.as_str())
    );
    assert!(env.audit_verify().status.success());
}

/// The JSON-RPC message with id `id` in a POST's reply body: a JSON body, or the `data:` lines
/// of an event stream.
fn message_with_id(body: &str, id: u64) -> Value {
    if let Ok(message) = serde_json::from_str::<Value>(body) {
        return message;
    }
    body.lines()
        .filter_map(|line| line.strip_prefix("data:"))
        .filter_map(|data| serde_json::from_str::<Value>(data.trim()).ok())
        .find(|message| message["id"] == json!(id))
        .unwrap_or_else(|| panic!("no message with id {id} in {body:?}"))
}

/// MCP 2025-11-25 has no JSON-RPC batches, and neither has this server over Streamable HTTP: a
/// POST of an array of requests, on a session opened by a normal `initialize` or in the
/// 2026-07-28 flow, is refused whole (400, `-32600`, `"id":null`, audited as
/// `batch_not_supported`) before any request of it reaches the gate. Not the call both
/// policies permit, nor the one Cedar has no permit for, nor the one a tenant `forbid` names
/// nor the one the JSON policy denies runs or is audited as a call; the refusal is the same
/// whatever the batch holds; the session and the server go on serving, and the permitted call
/// sent alone afterwards runs as the first (`committed`).
#[cfg(feature = "cedar")]
#[test]
fn a_json_rpc_batch_is_refused_whole_and_carries_no_call_past_the_policies() {
    let env = TestEnv::new();
    let mut policy: Value =
        serde_json::from_str(&std::fs::read_to_string(&env.policy).unwrap()).unwrap();
    policy["cedar"] = json!("roles.cedar");
    std::fs::write(&env.policy, policy.to_string()).unwrap();
    std::fs::write(
        env.path("roles.cedar"),
        r#"
@id("everyone-lists")
permit(principal, action == Toolgate::Action::"tools/list", resource);

@id("writers-write-approved")
permit(principal in Toolgate::Role::"writer", action == Toolgate::Action::"write_note", resource)
when { context.arguments.text like "ok*" };

@id("no-secrets")
forbid(principal, action == Toolgate::Action::"write_note", resource)
when { context.arguments.text like "*secret*" };
"#,
    )
    .unwrap();
    let alice = create_token(&env, "alice", &["--attr", "role=writer"]);
    let server = HttpServer::start(&env);
    let auth = format!("Bearer {alice}");
    let call = |id: u64, name: &str, arguments: Value| {
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
               "params": {"name": name, "arguments": arguments}})
    };
    let write = |id: u64, request_id: &str, text: &str| {
        call(
            id,
            "write_note",
            json!({"request_id": request_id, "text": text}),
        )
    };
    let victim = env.path("victim");
    std::fs::write(&victim, "still here").unwrap();
    let permitted = || write(101, "req-batch-0001", "ok hello");
    let no_permit = || write(102, "req-batch-0002", "unapproved");
    let forbidden = || write(103, "req-batch-0003", "ok, a secret");
    let denied = || call(104, "rm_rf", json!({"path": victim.to_str().unwrap()}));
    let unknown = || call(105, "no_such_tool", json!({}));
    let batches = [
        json!([permitted(), no_permit(), forbidden(), denied()]),
        json!([permitted()]),
        json!([no_permit()]),
        json!([forbidden()]),
        json!([denied()]),
        json!([unknown()]),
    ];

    // A session of the 2025-11-25 flow.
    let (status, headers, body) = server.post(
        &[("Authorization", &auth)],
        &json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "http-test", "version": "1"}}}),
    );
    assert_eq!(status, 200, "{body}");
    let session = header(&headers, "mcp-session-id").unwrap().to_owned();
    let on_session = [
        ("Authorization", auth.as_str()),
        ("Mcp-Session-Id", session.as_str()),
        ("MCP-Protocol-Version", "2025-11-25"),
    ];
    let (status, _, body) = server.post(
        &on_session,
        &json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    );
    assert!(status == 202 || status == 200, "{status} {body}");
    let mut refusals = Vec::new();
    for batch in &batches {
        let (status, _, body) = server.post(&on_session, batch);
        assert_eq!(status, 400, "{batch}: {body}");
        refusals.push(serde_json::from_str::<Value>(&body).unwrap());
    }
    // The 2026-07-28 flow (no session): the same.
    for batch in &batches {
        let (status, _, body) = server.post(
            &[
                ("Authorization", auth.as_str()),
                ("MCP-Protocol-Version", "2026-07-28"),
                ("Mcp-Method", "tools/call"),
            ],
            batch,
        );
        assert_eq!(status, 400, "{batch}: {body}");
        refusals.push(serde_json::from_str::<Value>(&body).unwrap());
    }
    assert_eq!(refusals[0]["id"], Value::Null, "{}", refusals[0]);
    assert_eq!(
        refusals[0]["error"]["code"],
        json!(-32600),
        "{}",
        refusals[0]
    );
    assert!(refusals.iter().all(|r| *r == refusals[0]), "{refusals:?}");
    assert!(!env.note_path("req-batch-0001").exists());
    assert!(!env.note_path("req-batch-0002").exists());
    assert!(!env.note_path("req-batch-0003").exists());
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "still here");
    assert!(
        !env.audit_records()
            .iter()
            .any(|r| r["method"] == "tools/call"),
        "{:?}",
        env.audit_records()
    );

    // The session still serves; each request alone is decided as usual.
    let alone = |message: Value, id: u64| {
        let (status, _, body) = server.post(&on_session, &message);
        assert_eq!(status, 200, "{body}");
        message_with_id(&body, id)
    };
    let list = alone(
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}),
        2,
    );
    // read_ledger has no Cedar permit: not listed.
    assert_eq!(listed_names(&list), ["write_note"]);
    let ok = alone(permitted(), 101);
    assert_eq!(status_of(&ok), "committed", "the batch ran it before: {ok}");
    let refused = alone(no_permit(), 102);
    assert_eq!(
        refused["result"]["structuredContent"]["rule"], "cedar",
        "{refused}"
    );
    let refused = alone(forbidden(), 103);
    assert_eq!(
        refused["result"]["structuredContent"]["policies"],
        json!(["no-secrets"]),
        "{refused}"
    );
    let denied = alone(denied(), 104);
    let unknown = alone(unknown(), 105);
    assert_eq!(denied["error"]["code"], json!(-32602), "{denied}");
    assert_eq!(denied["error"], unknown["error"]);
    assert!(env.note_path("req-batch-0001").exists());
    assert!(!env.note_path("req-batch-0002").exists());
    assert!(!env.note_path("req-batch-0003").exists());
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "still here");
    drop(server);

    let records = env.audit_records();
    assert_eq!(
        reasons(&records, "http/transport"),
        ["batch_not_supported"; 12]
    );
    let calls: Vec<(&str, &str, &str)> = records
        .iter()
        .filter(|r| r["method"] == "tools/call")
        .map(|r| {
            (
                r["name"].as_str().unwrap(),
                r["decision"].as_str().unwrap(),
                r["reason"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        calls,
        [
            ("write_note", "allow", "allow"),
            ("write_note", "deny", "cedar"),
            ("write_note", "deny", "cedar"),
            ("rm_rf", "deny", "deny"),
            ("no_such_tool", "deny", "unknown_tool"),
        ]
    );
    assert!(env.audit_verify().status.success());
}
