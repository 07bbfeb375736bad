#!/usr/bin/env bash
# Seeds fuzz/corpus/<target>/ (gitignored) from the repository's fixtures. Idempotent: files are
# named by content, and what the fuzzer added to a corpus is kept.
set -euo pipefail
cd "$(dirname "$0")"
root=..

# add TARGET FILE...: copies each file into the target's corpus under its SHA-256.
add() {
    local target=$1
    shift
    mkdir -p "corpus/$target"
    for file in "$@"; do
        [ -f "$file" ] || continue
        cp "$file" "corpus/$target/seed-$(sha256sum "$file" | cut -c1-16)"
    done
}

# add_text TARGET TEXT: a seed from literal bytes (printf escapes allowed).
add_text() {
    local tmp
    tmp=$(mktemp)
    printf "$2" >"$tmp"
    add "$1" "$tmp"
    rm -f "$tmp"
}

policies=("$root"/fixtures/policy.json "$root"/fixtures/policies/*.json)
locks=("$root"/toolgate.lock "$root"/fixtures/contract/golden.lock)

# canon: every JSON document of the fixtures, and each audit line on its own.
add canon "${policies[@]}" "${locks[@]}" "$root"/fixtures/contract/diff/*.json
tmpdir=$(mktemp -d)
trap 'rm -rf "$tmpdir"' EXIT
for log in "$root"/fixtures/audit/*.jsonl; do
    split -l 1 -d -a 3 "$log" "$tmpdir/$(basename "$log" .jsonl)-"
done
add canon "$tmpdir"/*
add_text canon '[1e21,1e-7,-0,0.1,123456789012345678901234567890,"\\u00e9\\ud83d\\ude00",{"b":1,"a":[]}]'

# policy: the policies alone, and followed by NUL and a call's arguments.
add policy "${policies[@]}"
for policy in "${policies[@]}"; do
    for args in '{"request_id":"abcdefgh","text":"hello"}' '{"path":"/srv/notes/../x","ids":[1,2],"filter":{}}' \
        '{"query":"q","limit":51,"minutes":0,"notes":[{"title":"\\u0007t"}]}'; do
        cp "$policy" "$tmpdir/p"
        printf '\0%s' "$args" >>"$tmpdir/p"
        add policy "$tmpdir/p"
    done
done

# audit_verify: every audit fixture, and each with the checkpoint files after the separator.
add audit_verify "$root"/fixtures/audit/*.jsonl
for log in "$root"/fixtures/audit/*.jsonl; do
    case $log in *.checkpoints.jsonl) continue ;; esac
    for cps in "$root"/fixtures/audit/*.checkpoints.jsonl; do
        { cat "$log"; printf -- '\n--checkpoints--\n'; cat "$cps"; } >"$tmpdir/a"
        add audit_verify "$tmpdir/a"
    done
done

# lockfile_parse: the lockfiles.
add lockfile_parse "${locks[@]}"

# gate_args: tool index, principal index (+0x80: the tool has an output schema), arguments. Tools:
# 0 read_ledger, 1 rm_rf, 2 write_note, 3 search_notes, 4 delete_notes, 5 send_reminder,
# 6 read_file, 7 admin_reset, 8 not_a_tool. Principals: 0 anonymous, 1 alice@example.com, 2 ci-bot.
add_text gate_args '\x00\x00{}'
add_text gate_args '\x02\x00{"request_id":"abcdefgh","text":"hello"}'
add_text gate_args '\x02\x02{"request_id":"abcdefgh","text":"h\xc3\xa9llo","extra":1}'
add_text gate_args '\x02\x00{"request_id":"\xc3\xa9\xc3\xa9\xc3\xa9","text":"x"}'
add_text gate_args '\x03\x00{"query":"\xe2\x98\x83","limit":51}'
add_text gate_args '\x04\x00{"ids":["a",1],"expected_count":2}'
add_text gate_args '\x04\x00{"filter":{"k":"\xe2\x98\x83"},"expected_count":-1}'
add_text gate_args '\x05\x00{"minutes":1441,"message":"<\xe2\x98\x83>","other":5}'
add_text gate_args '\x06\x01{"path":"/srv/notes/alice/../../etc/passwd","options":{"encoding":"utf-16"}}'
add_text gate_args '\x06\x00{"path":"/srv/notes/\xe2\x98\x83"}'
add_text gate_args '\x07\x01{"scope":["a","a"],"reason":"\xe2\x98\x83\xe2\x98\x83"}'
add_text gate_args '\x07\x01{"scope":"all"}'
add_text gate_args '\x08\x00{"a":1}'
add_text gate_args '\x02\x80{"request_id":"abc","text":"x"}'
add_text gate_args '\x03\x80{"query":"\xe2\x98\x83","limit":51}'

# cedar_load: policy sets for its two tools, delete_booking {id, amount, tags, room {floor}} and
# list_bookings (every seed loads; the fuzzer mutates them into sets that do not).
add_text cedar_load '@id("lists") permit(principal, action == Toolgate::Action::"tools/list", resource);\n@id("all") permit(principal, action, resource);\n'
add_text cedar_load '@id("everyone-lists")\npermit(principal, action == Toolgate::Action::"tools/list", resource);\n@id("admins")\npermit(principal in Toolgate::Role::"admin", action == Toolgate::Action::"delete_booking", resource)\nwhen { context.arguments.amount < 100 && context.arguments has tags && context.arguments.tags.contains("x") };\n@id("ground")\nforbid(principal, action == Toolgate::Action::"delete_booking", resource)\nwhen { context.arguments has room && context.arguments.room has floor && context.arguments.room.floor == 0 };\n'
add_text cedar_load '@id("readers") permit(principal, action in [Toolgate::Action::"tools/list", Toolgate::Action::"list_bookings"], resource)\nwhen { principal.channel == "http" && principal has tenant && principal.tenant like "ac*" };\nforbid(principal, action in Toolgate::Action::"tools/call", resource)\nwhen { resource.destructive && context has client && context.client != "desk" }\nunless { principal in Toolgate::Role::"admin" };\n'
add_text cedar_load 'permit(principal == Toolgate::Caller::"acme/alice", action == Toolgate::Action::"delete_booking", resource is Toolgate::Tool)\nwhen { context.now > 0 && context.arguments.id != "" && (if context.arguments has room then context.arguments.room has floor else true) && principal.scopes.isEmpty() };\nforbid(principal, action, resource) when { principal.hasTag("dept") && principal.getTag("dept") == "x" };\n'

# cedar_request: a caller byte (bit 0 admin; bits 1-2 tenant none, acme, globex, "acme\0"),
# then delete_booking's arguments.
add_text cedar_request '\x03{"id":"b-1","amount":50}'
add_text cedar_request '\x03{"id":"b-1","amount":99.0,"tags":["x","y"],"room":{"floor":1,"kind":"suite"}}'
add_text cedar_request '\x03{"id":"b-1","amount":5,"room":{"floor":-0}}'
add_text cedar_request '\x02{"id":"b-1","amount":5,"extra":{"deep":[1,2]}}'
add_text cedar_request '\x05{"id":"\xc3\xa9","amount":-9223372036854775808,"tags":[],"room":{}}'
add_text cedar_request '\x07{"id":"b","amount":1e2,"room":null,"tags":null}'

for target in audit_chain lockfile_roundtrip; do
    mkdir -p "corpus/$target"
done
