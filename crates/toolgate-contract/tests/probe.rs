//! Drift probes: levels, degradation of failing probes, the case file and the structural judge.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::cell::Cell;

use serde_json::{Value, json};
use toolgate_contract::probe::{
    DriftLevel, Judge, JudgeError, NEUTRAL_SCORE, ProbeCase, ProbeLoadError, ProbeResult,
    StructuralJudge, load_cases, run_probes, summarize, write_cases,
};

fn structural(baseline: Value, current: Value) -> f64 {
    StructuralJudge
        .similarity("t", &json!({}), &baseline, &current)
        .unwrap()
}

fn case(tool: &str, baseline: Value) -> ProbeCase {
    ProbeCase {
        tool: tool.to_owned(),
        input: json!({"q": tool}),
        baseline,
    }
}

/// A judge that answers by tool name, so one run can mix good and failing probes.
struct ScriptedJudge;

impl Judge for ScriptedJudge {
    fn similarity(
        &self,
        tool: &str,
        input: &Value,
        baseline: &Value,
        current: &Value,
    ) -> Result<f64, JudgeError> {
        match tool {
            "judge_err" => Err(JudgeError::Unavailable {
                reason: "timeout after 30s".to_owned(),
            }),
            "nan" => Ok(f64::NAN),
            "too_big" => Ok(1.5),
            "negative" => Ok(-0.1),
            _ => StructuralJudge.similarity(tool, input, baseline, current),
        }
    }
}

#[test]
fn structural_judge_scores() {
    let value = json!({"a": 1, "b": [true, null, "x"], "c": {"d": 2.5, "e": {}}});
    assert_eq!(structural(value.clone(), value.clone()), 1.0);
    assert_eq!(structural(json!("same"), json!("same")), 1.0);
    assert_eq!(structural(json!({"a": 1}), json!({"b": 1})), 0.0);
    assert_eq!(structural(json!({"a": 1}), json!([1])), 0.0);
    // A scalar root and an object share no pointer.
    assert_eq!(structural(json!(1), json!({"a": 1})), 0.0);
    // Same single pointer (the root), different leaf: half the score, from the shape alone.
    assert_eq!(structural(json!(1), json!(2)), 0.5);

    // One changed leaf among ten: 0.5 * 1 + 0.5 * 9/10.
    let baseline: Value = (0..10).map(|i| (format!("k{i}"), json!(i))).collect();
    let mut current = baseline.clone();
    current["k3"] = json!("changed");
    let score = structural(baseline.clone(), current);
    assert!(score > 0.0 && score < 1.0, "{score}");
    assert!((score - 0.95).abs() < 1e-12, "{score}");

    // One leaf added among ten: Jaccard 10/11, all shared leaves equal.
    let mut grown = baseline.clone();
    grown["new"] = json!(true);
    let score = structural(baseline, grown);
    assert!((score - (0.5 * 10.0 / 11.0 + 0.5)).abs() < 1e-12, "{score}");
}

#[test]
fn structural_judge_is_symmetric_and_ignores_key_order() {
    let a = json!({"x": [1, 2, 3], "y": {"z": "w"}});
    let b = json!({"y": {"z": "v"}, "x": [1, 2]});
    assert_eq!(structural(a.clone(), b.clone()), structural(b, a));
    let reordered: Value = serde_json::from_str(r#"{"y":{"z":"w"},"x":[1,2,3]}"#).unwrap();
    assert_eq!(
        structural(json!({"x": [1, 2, 3], "y": {"z": "w"}}), reordered),
        1.0
    );
}

#[test]
fn level_thresholds() {
    let check = |score: f64, level: DriftLevel| {
        assert_eq!(DriftLevel::from_score(score), level, "score {score}");
    };
    check(1.0, DriftLevel::None);
    check(0.95, DriftLevel::None);
    check(0.9499, DriftLevel::Low);
    check(0.75, DriftLevel::Low);
    check(0.7499, DriftLevel::Medium);
    check(0.5, DriftLevel::Medium);
    check(0.4999, DriftLevel::High);
    check(0.0, DriftLevel::High);
    // Out-of-contract inputs still map somewhere without panicking.
    check(f64::NAN, DriftLevel::High);
    check(-1.0, DriftLevel::High);
    check(2.0, DriftLevel::None);
    check(f64::INFINITY, DriftLevel::None);
    let names: Vec<&str> = [
        DriftLevel::None,
        DriftLevel::Low,
        DriftLevel::Medium,
        DriftLevel::High,
    ]
    .iter()
    .map(|level| level.as_str())
    .collect();
    assert_eq!(names, ["none", "low", "medium", "high"]);
    assert_eq!(
        serde_json::to_string(&DriftLevel::Medium).unwrap(),
        "\"medium\""
    );
}

#[test]
fn failing_probes_degrade_and_others_are_scored() {
    let cases = vec![
        case("same", json!({"v": 1})),
        case("judge_err", json!({"v": 1})),
        case("nan", json!({"v": 1})),
        case("too_big", json!({"v": 1})),
        case("negative", json!({"v": 1})),
        case("output_err", json!({"v": 1})),
        case("changed", json!({"v": 1})),
    ];
    let calls = Cell::new(0);
    let mut current = |tool: &str, input: &Value| -> Result<Value, String> {
        calls.set(calls.get() + 1);
        assert_eq!(input, &json!({"q": tool}), "the recorded input is replayed");
        match tool {
            "output_err" => Err("connection refused".to_owned()),
            "changed" => Ok(json!({"v": 2})),
            _ => Ok(json!({"v": 1})),
        }
    };
    let results = run_probes(&ScriptedJudge, &cases, &mut current);
    assert_eq!(calls.get(), cases.len());
    let tools: Vec<&str> = results.iter().map(|r| r.tool.as_str()).collect();
    assert_eq!(
        tools,
        [
            "same",
            "judge_err",
            "nan",
            "too_big",
            "negative",
            "output_err",
            "changed"
        ]
    );

    assert_eq!(
        results[0],
        ProbeResult {
            tool: "same".to_owned(),
            score: 1.0,
            level: DriftLevel::None,
            degraded: None,
        }
    );
    for (result, needle) in results[1..6].iter().zip([
        "timeout after 30s",
        "NaN",
        "1.5",
        "-0.1",
        "connection refused",
    ]) {
        assert_eq!(result.score, NEUTRAL_SCORE, "{result:?}");
        assert_eq!(result.level, DriftLevel::Medium, "{result:?}");
        let reason = result
            .degraded
            .as_deref()
            .expect("a degraded probe says why");
        assert!(reason.contains(needle), "{reason:?} lacks {needle:?}");
    }
    assert_eq!(results[6].score, 0.5);
    assert_eq!(results[6].degraded, None);
    assert_eq!(summarize(&results), DriftLevel::Medium);
}

#[test]
fn summarize_picks_the_worst() {
    let result = |level| ProbeResult {
        tool: "t".to_owned(),
        score: 0.0,
        level,
        degraded: None,
    };
    assert_eq!(summarize(&[]), DriftLevel::None);
    assert_eq!(
        summarize(&[result(DriftLevel::Low), result(DriftLevel::None)]),
        DriftLevel::Low
    );
    assert_eq!(
        summarize(&[
            result(DriftLevel::Medium),
            result(DriftLevel::High),
            result(DriftLevel::Low),
        ]),
        DriftLevel::High
    );
}

#[test]
fn cases_round_trip_through_json_lines() {
    let cases = vec![
        case(
            "search",
            json!({"hits": [{"id": 1, "title": "line\nbreak"}]}),
        ),
        case("read", json!("plain text")),
        case("empty", json!(null)),
    ];
    let mut bytes = Vec::new();
    write_cases(&mut bytes, &cases).unwrap();
    let text = String::from_utf8(bytes.clone()).unwrap();
    assert_eq!(text.lines().count(), cases.len());
    assert!(text.ends_with('\n'));
    assert_eq!(load_cases(bytes.as_slice()).unwrap(), cases);

    // Blank lines are skipped.
    let spaced = text.replace('\n', "\n\n  \n");
    assert_eq!(load_cases(spaced.as_bytes()).unwrap(), cases);
}

#[test]
fn bad_case_lines_are_named() {
    let good = r#"{"tool":"a","input":{},"baseline":1}"#;
    let check = |text: String, line: usize| match load_cases(text.as_bytes()) {
        Err(err) => {
            let found = match &err {
                ProbeLoadError::Json { line, .. }
                | ProbeLoadError::EmptyTool { line }
                | ProbeLoadError::Io { line, .. } => *line,
                other => panic!("unexpected variant {other:?}"),
            };
            assert_eq!(found, line, "{text:?}: {err}");
            assert!(err.to_string().contains(&format!("line {line}")), "{err}");
        }
        Ok(cases) => panic!("{text:?} loaded as {cases:?}"),
    };
    check(format!("{good}\n{{not json\n"), 2);
    check(format!("{good}\n\n{good}\n[1, 2]\n"), 4);
    check(r#"{"tool":"a","input":{}}"#.to_owned(), 1);
    check(
        format!("{good}\n{}", good.replace("baseline", "baselin")),
        2,
    );
    check(format!("{good}\n{}", good.replace("\"a\"", "\"\"")), 2);
    check(format!("{good}\n{}", good.replace("\"a\"", "7")), 2);
    // Invalid UTF-8 is an I/O error on its line, not a panic.
    let mut bytes = format!("{good}\n").into_bytes();
    bytes.extend_from_slice(b"{\"tool\":\"\xff\"}\n");
    match load_cases(bytes.as_slice()) {
        Err(ProbeLoadError::Io { line: 2, .. }) => {}
        other => panic!("expected an I/O error on line 2, got {other:?}"),
    }
}
