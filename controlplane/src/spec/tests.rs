use super::*;

/// The spec from the AM issue, in YAML.
const QUICKSTART_YAML: &str = r#"
name: quickstart
data:
  sources: [{ uri: file:///data/train, format: parquet, columns: [id, features, label] }]
  batch_size: 1024
  epochs: 1
  task_rows: 65536
  shuffle: { seed: 7, window: 4 }
nodes: 2                      # node daemons (local launcher: processes on this machine)
roles:
  - { name: worker, num: 2, command: ["sluice", "consume", "--ids-out", "/tmp/ids-{rank}.bin"] }
failover:
  restart: on-failure         # on-failure | never | always
  max_failures: 3             # per executor; plus max_total_failures for the job
  max_task_attempts: 3
  heartbeat_interval_ms: 1000
  heartbeat_timeout_ms: 10000
  task_success_percent: 100   # early stop rules, as in Primus
  task_failed_percent: 50
checkpoint: { uri: file:///tmp/sluice/ckpt }   # journal + snapshots; s3:// works too
"#;

/// The smallest valid spec; every test below changes one thing in it.
const MINIMAL_YAML: &str = r#"
name: small
data:
  sources: [{ uri: "file:///data/train", format: parquet }]
roles:
  - { name: worker, command: [sluice, consume] }
"#;

fn parse_yaml(text: &str) -> Result<JobSpec, SpecError> {
    JobSpec::parse(text, Format::Yaml)
}

/// Parses a spec that must be refused and returns its error.
fn refused(text: &str) -> SpecError {
    match parse_yaml(text) {
        Ok(spec) => panic!("spec was accepted but should be refused: {spec:?}"),
        Err(error) => error,
    }
}

/// Asserts that an error is about `path` and that its message contains every fragment.
fn assert_error(error: &SpecError, path: &str, fragments: &[&str]) {
    assert_eq!(error.key_path(), Some(path), "wrong key path in: {error}");
    let message = error.to_string();
    for fragment in fragments {
        assert!(
            message.contains(fragment),
            "message `{message}` lacks `{fragment}`"
        );
    }
}

/// The minimal spec with `extra` appended to the top level.
fn minimal_with(extra: &str) -> String {
    format!("{MINIMAL_YAML}{extra}\n")
}

/// The minimal spec with one source written out in full.
fn with_source(source: &str) -> String {
    format!(
        "name: small\ndata:\n  sources: [{source}]\nroles:\n  - {{ name: worker, command: [sluice, consume] }}\n"
    )
}

/// The minimal spec with one role written out in full.
fn with_role(role: &str) -> String {
    format!(
        "name: small\ndata:\n  sources: [{{ uri: 'file:///d', format: parquet }}]\nroles:\n  - {role}\n"
    )
}

#[test]
fn quickstart_spec_parses_into_typed_values() {
    let sut = parse_yaml(QUICKSTART_YAML).expect("quickstart spec is valid");
    assert_eq!(sut.name, "quickstart");
    assert_eq!(sut.nodes, 2);
    assert_eq!(sut.data.sources.len(), 1);
    let source = &sut.data.sources[0];
    assert_eq!(source.uri, "file:///data/train");
    assert_eq!(source.format, SourceFormat::Parquet);
    assert_eq!(
        source.columns.as_deref(),
        Some(&["id".to_owned(), "features".to_owned(), "label".to_owned()][..])
    );
    assert_eq!(
        sut.data.shuffle,
        ShuffleSpec {
            enabled: true,
            seed: 7,
            window: 4
        }
    );
    assert_eq!(sut.data.task_rows, 65_536);
    assert_eq!(sut.roles[0].num, 2);
    assert_eq!(sut.roles[0].command[3], "/tmp/ids-{rank}.bin");
    assert_eq!(sut.failover.restart, RestartPolicy::OnFailure);
    assert_eq!(sut.failover.heartbeat_timeout_ms, 10_000);
    assert_eq!(sut.failover.task_failed_percent, 50.0);
    assert_eq!(sut.launcher, LauncherKind::Local);
    assert_eq!(
        sut.checkpoint,
        Some(CheckpointSpec {
            uri: "file:///tmp/sluice/ckpt".to_owned(),
            interval_s: 300,
            keep: None,
        })
    );
}

#[test]
fn defaults_fill_every_optional_key() {
    let sut = parse_yaml(MINIMAL_YAML).expect("minimal spec is valid");
    assert_eq!(sut.nodes, 1);
    assert_eq!(sut.data.batch_size, 1024);
    assert_eq!(sut.data.epochs, 1);
    assert_eq!(sut.data.task_rows, 65_536);
    assert_eq!(
        sut.data.shuffle,
        ShuffleSpec {
            enabled: false,
            seed: 0,
            window: 4
        }
    );
    assert_eq!(sut.data.resplit_margin_rows, 1024);
    assert_eq!(sut.data.resplit_min_rows, 1024);
    assert_eq!(sut.roles[0].num, 1);
    assert!(sut.roles[0].env.is_empty());
    assert_eq!(sut.roles[0].resources.gpu, 0);
    assert_eq!(sut.failover.restart, RestartPolicy::OnFailure);
    assert_eq!(sut.failover.max_failures, 3);
    // 3 failures for each of 1 node and 1 trainer.
    assert_eq!(sut.failover.max_total_failures, 6);
    assert_eq!(sut.failover.max_task_attempts, 3);
    assert_eq!(sut.failover.blacklist_after_failures, 3);
    assert_eq!(sut.failover.heartbeat_interval_ms, 1000);
    assert_eq!(sut.failover.heartbeat_timeout_ms, 10_000);
    assert_eq!(sut.failover.task_success_percent, 100.0);
    assert_eq!(sut.failover.task_failed_percent, 100.0);
    assert_eq!(sut.launcher, LauncherKind::Local);
    assert_eq!(sut.checkpoint, None);
}

#[test]
fn toml_and_json_give_the_same_spec_as_yaml() {
    let toml_text = r#"
name = "small"
[data]
sources = [{ uri = "file:///data/train", format = "parquet" }]
[[roles]]
name = "worker"
command = ["sluice", "consume"]
"#;
    let json_text = r#"{"name": "small", "data": {"sources": [{"uri": "file:///data/train",
        "format": "parquet"}]}, "roles": [{"name": "worker", "command": ["sluice", "consume"]}]}"#;
    let from_yaml = parse_yaml(MINIMAL_YAML).expect("yaml is valid");
    assert_eq!(
        JobSpec::parse(toml_text, Format::Toml).expect("toml is valid"),
        from_yaml
    );
    assert_eq!(
        JobSpec::parse(json_text, Format::Json).expect("json is valid"),
        from_yaml
    );
}

#[test]
fn format_follows_the_file_extension() {
    assert_eq!(
        Format::from_path(Path::new("job.yaml")).ok(),
        Some(Format::Yaml)
    );
    assert_eq!(
        Format::from_path(Path::new("job.YML")).ok(),
        Some(Format::Yaml)
    );
    assert_eq!(
        Format::from_path(Path::new("job.toml")).ok(),
        Some(Format::Toml)
    );
    assert_eq!(
        Format::from_path(Path::new("job.json")).ok(),
        Some(Format::Json)
    );
    let error = Format::from_path(Path::new("job.txt")).expect_err("txt is not a spec format");
    assert!(error.to_string().contains(".yaml, .yml, .toml or .json"));
}

#[test]
fn sniffing_tells_the_three_formats_apart() {
    assert_eq!(Format::sniff(MINIMAL_YAML), Format::Yaml);
    assert_eq!(Format::sniff("  {\"name\": \"x\"}"), Format::Json);
    assert_eq!(Format::sniff("# job\nname = \"x\"\n"), Format::Toml);
    assert_eq!(Format::sniff("[data]\nepochs = 1\n"), Format::Toml);
    assert_eq!(Format::sniff("---\nname: x\n"), Format::Yaml);
    assert_eq!(Format::sniff("command: \"a=b\"\n"), Format::Yaml);
}

#[test]
fn from_path_reads_a_file_and_names_a_missing_one() {
    let directory = tempfile::tempdir().expect("temporary directory");
    let path = directory.path().join("job.yml");
    std::fs::write(&path, QUICKSTART_YAML).expect("write spec");
    let sut = JobSpec::from_path(&path).expect("file spec is valid");
    assert_eq!(sut.name, "quickstart");

    let missing = directory.path().join("absent.yaml");
    let error = JobSpec::from_path(&missing).expect_err("missing file");
    assert!(matches!(error, SpecError::Read { .. }));
    assert!(error.to_string().contains("absent.yaml"));
}

#[test]
fn syntax_errors_name_the_format_and_place() {
    let error = parse_yaml("name: [unclosed\n").expect_err("bad yaml");
    assert!(matches!(
        error,
        SpecError::Syntax {
            format: Format::Yaml,
            ..
        }
    ));
    assert!(error.to_string().contains("line"), "{error}");
    let error = JobSpec::parse("name = ", Format::Toml).expect_err("bad toml");
    assert!(matches!(
        error,
        SpecError::Syntax {
            format: Format::Toml,
            ..
        }
    ));
    let error = JobSpec::parse("{\"name\": }", Format::Json).expect_err("bad json");
    assert!(error.to_string().contains("column"), "{error}");
}

#[test]
fn an_empty_document_is_refused() {
    assert!(matches!(refused("   \n# nothing\n"), SpecError::Empty));
}

#[test]
fn a_top_level_list_is_refused() {
    let error = refused("- a\n- b\n");
    assert_error(&error, "(top level)", &["map"]);
}

#[test]
fn duplicate_keys_are_refused() {
    let error = JobSpec::parse(
        r#"{"name": "a", "name": "b", "data": {"sources": []}, "roles": []}"#,
        Format::Json,
    )
    .expect_err("duplicate key");
    assert!(
        error.to_string().contains("`name` appears twice"),
        "{error}"
    );
}

#[test]
fn unknown_keys_are_refused_with_a_suggestion() {
    let error = refused(&minimal_with("failover: { heartbeat_timout_ms: 5000 }"));
    assert_error(
        &error,
        "failover.heartbeat_timout_ms",
        &["unknown key", "did you mean `heartbeat_timeout_ms`?"],
    );
    let error = refused(&with_source(
        "{ uri: 'file:///d', format: parquet, colums: [a] }",
    ));
    assert_error(
        &error,
        "data.sources[0].colums",
        &["did you mean `columns`?"],
    );
}

#[test]
fn unknown_keys_far_from_any_list_the_allowed_ones() {
    let error = refused(&minimal_with("launcher: { kind: local, zone: eu }"));
    assert_error(&error, "launcher.zone", &["use one of: kind"]);
    let error = refused(&minimal_with("colour: blue"));
    assert_error(&error, "colour", &["use one of: name, data, nodes, roles"]);
}

#[test]
fn missing_required_keys_are_named() {
    let error = refused("data: { sources: [{ uri: 'file:///d', format: parquet }] }\nroles: []\n");
    assert_error(&error, "name", &["is missing", "name: quickstart"]);
    let error = refused("name: a\ndata: { batch_size: 8 }\nroles: []\n");
    assert_error(&error, "data.sources", &["is missing"]);
    let error = refused(&with_source("{ format: parquet }"));
    assert_error(&error, "data.sources[0].uri", &["is missing", "file:///"]);
    let error = refused(&with_role("{ name: worker }"));
    assert_error(&error, "roles[0].command", &["is missing"]);
}

#[test]
fn wrong_types_name_the_key_and_the_expected_type() {
    let error = refused(&minimal_with("nodes: two"));
    assert_error(&error, "nodes", &["string \"two\"", "whole number"]);
    let error = refused(&minimal_with("nodes: -1"));
    assert_error(&error, "nodes", &["-1", "whole number"]);
    let error = refused(&with_role("{ name: worker, command: sluice }"));
    assert_error(&error, "roles[0].command", &["a list"]);
}

#[test]
fn name_must_be_a_lowercase_slug() {
    assert_error(
        &refused(
            "name: ''\ndata: {sources: [{uri: 'file:///d', format: parquet}]}\nroles: [{name: w, command: [x]}]\n",
        ),
        "name",
        &["is empty"],
    );
    let error = refused(
        "name: My Job\ndata: {sources: [{uri: 'file:///d', format: parquet}]}\nroles: [{name: w, command: [x]}]\n",
    );
    assert_error(&error, "name", &["`My Job`", "lowercase"]);
    let long_name = "a".repeat(64);
    let error = refused(&format!(
        "name: {long_name}\ndata: {{sources: [{{uri: 'file:///d', format: parquet}}]}}\nroles: [{{name: w, command: [x]}}]\n"
    ));
    assert_error(&error, "name", &["64 characters", "at most 63"]);
}

#[test]
fn sources_must_not_be_empty() {
    let error = refused("name: a\ndata: { sources: [] }\nroles: [{name: w, command: [x]}]\n");
    assert_error(&error, "data.sources", &["empty list"]);
}

#[test]
fn source_uris_need_a_supported_scheme_and_a_location() {
    let error = refused(&with_source("{ uri: /data/train, format: parquet }"));
    assert_error(
        &error,
        "data.sources[0].uri",
        &["no scheme", "file:///data/train"],
    );
    let error = refused(&with_source("{ uri: 'hdfs://nn/data', format: parquet }"));
    assert_error(&error, "data.sources[0].uri", &["hdfs://", "s3://"]);
    let error = refused(&with_source("{ uri: 's3://', format: parquet }"));
    assert_error(&error, "data.sources[0].uri", &["names no bucket"]);
}

#[test]
fn source_format_is_checked_or_inferred() {
    let error = refused(&with_source("{ uri: 'file:///d', format: parket }"));
    assert_error(
        &error,
        "data.sources[0].format",
        &["`parket`", "did you mean `parquet`?"],
    );
    let error = refused(&with_source("{ uri: 's3://bucket/table' }"));
    assert_error(
        &error,
        "data.sources[0].format",
        &["is missing", "does not tell the format", "delta"],
    );
    let sut = parse_yaml(&with_source("{ uri: 'file:///d/part-0.parquet' }")).expect("inferred");
    assert_eq!(sut.data.sources[0].format, SourceFormat::Parquet);
    let sut = parse_yaml(&with_source("{ uri: 'gs://b/x.jsonl' }")).expect("inferred");
    assert_eq!(sut.data.sources[0].format, SourceFormat::Jsonl);
}

#[test]
fn columns_must_be_named_once_each() {
    let error = refused(&with_source(
        "{ uri: 'file:///d', format: csv, columns: [] }",
    ));
    assert_error(&error, "data.sources[0].columns", &["empty list"]);
    let error = refused(&with_source(
        "{ uri: 'file:///d', format: csv, columns: [a, ''] }",
    ));
    assert_error(&error, "data.sources[0].columns[1]", &["empty column name"]);
    let error = refused(&with_source(
        "{ uri: 'file:///d', format: csv, columns: [a, b, a] }",
    ));
    assert_error(
        &error,
        "data.sources[0].columns[2]",
        &["repeats the column `a`"],
    );
}

#[test]
fn a_blank_filter_is_refused() {
    let error = refused(&with_source(
        "{ uri: 'file:///d', format: csv, filter: '  ' }",
    ));
    assert_error(&error, "data.sources[0].filter", &["is blank"]);
    let sut = parse_yaml(&with_source(
        "{ uri: 'file:///d', format: csv, filter: 'label > 0' }",
    ))
    .expect("filter kept");
    assert_eq!(sut.data.sources[0].filter.as_deref(), Some("label > 0"));
}

#[test]
fn an_iceberg_table_is_pinned_by_snapshot_and_told_by_its_metadata_file_but_not_followed() {
    let sut = parse_yaml(&with_source(
        "{ uri: 's3://lake/db/t', format: iceberg, version: 5281327309441785089 }",
    ))
    .expect("a pinned snapshot");
    assert_eq!(sut.data.sources[0].format, SourceFormat::Iceberg);
    assert_eq!(sut.data.sources[0].version, Some(5_281_327_309_441_785_089));
    let sut = parse_yaml(&with_source(
        "{ uri: 's3://lake/db/t/metadata/00007-9f1c.metadata.json' }",
    ))
    .expect("a metadata file");
    assert_eq!(sut.data.sources[0].format, SourceFormat::Iceberg);
    let error = refused(&with_source(
        "{ uri: 's3://lake/db/t', format: iceberg, follow: true }",
    ));
    assert_error(
        &error,
        "data.sources[0].follow",
        &["Parquet directory or a Delta table"],
    );
    let error = refused(&with_source("{ uri: 's3://lake/db/t', format: icebreg }"));
    assert_error(&error, "data.sources[0].format", &["iceberg"]);
}

#[test]
fn a_delta_source_is_pinned_by_version_or_timestamp_and_only_a_delta_source() {
    let sut = parse_yaml(&with_source(
        "{ uri: 'file:///t', format: delta, version: 3 }",
    ))
    .expect("a pinned version");
    assert_eq!(sut.data.sources[0].version, Some(3));
    let sut = parse_yaml(&with_source(
        "{ uri: 'file:///t', format: delta, timestamp: '2026-01-02T03:04:05Z' }",
    ))
    .expect("a pinned time");
    assert_eq!(
        sut.data.sources[0].timestamp.as_deref(),
        Some("2026-01-02T03:04:05Z")
    );
    let error = refused(&with_source(
        "{ uri: 'file:///t', format: delta, version: 3, timestamp: 1700000000000 }",
    ));
    assert_error(
        &error,
        "data.sources[0].timestamp",
        &["together with `version`"],
    );
    let error = refused(&with_source(
        "{ uri: 'file:///d', format: parquet, version: 3 }",
    ));
    assert_error(
        &error,
        "data.sources[0].version",
        &[
            "the source's format is parquet",
            "format: delta",
            "format: iceberg",
        ],
    );
}

#[test]
fn a_source_is_followed_by_a_flag_or_with_settings() {
    let sut = parse_yaml(&with_source(
        "{ uri: 'file:///d', format: parquet, follow: true }",
    ))
    .expect("follow: true");
    assert_eq!(
        sut.data.sources[0].follow,
        Some(FollowSpec {
            interval_ms: FollowSpec::DEFAULT_INTERVAL_MS,
            until_version: None,
            until_timestamp_ms: None,
        })
    );
    let sut = parse_yaml(&with_source(
        "{ uri: 'file:///d', format: parquet, follow: false }",
    ))
    .expect("follow: false");
    assert_eq!(sut.data.sources[0].follow, None);
    let sut = parse_yaml(&with_source(
        "{ uri: 'file:///t', format: delta, version: 2, follow: { interval_ms: 250, until_version: 4, until_timestamp: '2026-01-02T03:04:05Z' } }",
    ))
    .expect("follow settings");
    assert_eq!(
        sut.data.sources[0].follow,
        Some(FollowSpec {
            interval_ms: 250,
            until_version: Some(4),
            until_timestamp_ms: Some(1_767_323_045_000),
        })
    );
}

#[test]
fn follow_settings_are_checked_naming_the_key() {
    let error = refused(&with_source(
        "{ uri: 'file:///d', format: csv, follow: true }",
    ));
    assert_error(
        &error,
        "data.sources[0].follow",
        &["csv source", "Parquet directory or a Delta table"],
    );
    let error = refused(&with_source(
        "{ uri: 'file:///d', format: parquet, follow: { until_version: 3 } }",
    ));
    assert_error(
        &error,
        "data.sources[0].follow.until_version",
        &["format is parquet", "until_timestamp"],
    );
    let error = refused(&with_source(
        "{ uri: 'file:///t', format: delta, version: 5, follow: { until_version: 3 } }",
    ));
    assert_error(
        &error,
        "data.sources[0].follow.until_version",
        &["(3) is before the pinned version (5)"],
    );
    let error = refused(&with_source(
        "{ uri: 'file:///t', format: delta, follow: { until_timestamp: 'yesterday' } }",
    ));
    assert_error(
        &error,
        "data.sources[0].follow.until_timestamp",
        &["`yesterday` is not a time", "RFC 3339"],
    );
    let error = refused(&with_source(
        "{ uri: 'file:///t', format: delta, follow: { interval_ms: 1 } }",
    ));
    assert_error(&error, "data.sources[0].follow.interval_ms", &["is 1"]);
    let error = refused(&with_source(
        "{ uri: 'file:///t', format: delta, follow: { every: 3 } }",
    ));
    assert_error(&error, "data.sources[0].follow.every", &["interval_ms"]);
    let error = refused(&with_source(
        "{ uri: 'file:///t', format: delta, follow: 3 }",
    ));
    assert_eq!(error.key_path(), Some("data.sources[0].follow"), "{error}");
}

#[test]
fn a_followed_source_needs_a_single_epoch() {
    let error = refused(
        "name: small\ndata:\n  epochs: 2\n  sources: [{ uri: 'file:///d', format: parquet, follow: true }]\nroles:\n  - { name: worker, command: [sluice, consume] }\n",
    );
    assert_error(
        &error,
        "data.epochs",
        &["is 2, but data.sources[0] is followed", "set epochs to 1"],
    );
}

#[test]
fn storage_options_accept_scalars_and_refuse_empty_keys() {
    let sut = parse_yaml(&with_source(
        "{ uri: 's3://b/x.parquet', storage_options: { AWS_ALLOW_HTTP: true, AWS_REGION: eu-1, PORT: 8333 } }",
    ))
    .expect("scalars become strings");
    let options = &sut.data.sources[0].storage_options;
    assert_eq!(
        options.get("AWS_ALLOW_HTTP").map(String::as_str),
        Some("true")
    );
    assert_eq!(options.get("PORT").map(String::as_str), Some("8333"));
    let error = refused(&with_source(
        "{ uri: 's3://b/x.parquet', storage_options: { '': x } }",
    ));
    assert_error(&error, "data.sources[0].storage_options", &["empty key"]);
    let error = refused(&with_source(
        "{ uri: 's3://b/x.parquet', storage_options: { A: [1] } }",
    ));
    assert_error(
        &error,
        "data.sources[0].storage_options.A",
        &["string, number or boolean"],
    );
}

#[test]
fn zero_counts_are_refused_where_one_is_the_least() {
    for (key, yaml) in [
        ("data.batch_size", "batch_size: 0"),
        ("data.epochs", "epochs: 0"),
        ("data.task_rows", "task_rows: 0"),
        ("data.resplit_min_rows", "resplit_min_rows: 0"),
        ("data.shuffle.window", "shuffle: { window: 0 }"),
    ] {
        let text = format!(
            "name: a\ndata:\n  sources: [{{ uri: 'file:///d', format: csv }}]\n  {yaml}\nroles: [{{name: w, command: [x]}}]\n"
        );
        assert_error(&refused(&text), key, &["is 0", "1 or more"]);
    }
    assert_error(&refused(&minimal_with("nodes: 0")), "nodes", &["is 0"]);
    assert_error(
        &refused(&with_role("{ name: w, num: 0, command: [x] }")),
        "roles[0].num",
        &["is 0"],
    );
}

#[test]
fn resplit_settings_follow_batch_size_unless_set() {
    let text = "name: a\ndata:\n  sources: [{ uri: 'file:///d', format: csv }]\n  batch_size: 64\n  resplit_margin_rows: 0\nroles: [{name: w, command: [x]}]\n";
    let sut = parse_yaml(text).expect("valid");
    assert_eq!(sut.data.resplit_margin_rows, 0);
    assert_eq!(sut.data.resplit_min_rows, 64);
}

#[test]
fn roles_must_exist_and_have_unique_valid_names() {
    let error = refused("name: a\ndata: {sources: [{uri: 'file:///d', format: csv}]}\nroles: []\n");
    assert_error(&error, "roles", &["empty list"]);
    let error = refused(
        "name: a\ndata: {sources: [{uri: 'file:///d', format: csv}]}\nroles: [{name: w, command: [x]}, {name: w, command: [y]}]\n",
    );
    assert_error(&error, "roles[1].name", &["repeats the role name `w`"]);
    let error = refused(&with_role("{ name: Worker!, command: [x] }"));
    assert_error(&error, "roles[0].name", &["lowercase"]);
}

#[test]
fn role_commands_must_name_a_program() {
    assert_error(
        &refused(&with_role("{ name: w, command: [] }")),
        "roles[0].command",
        &["empty list"],
    );
    assert_error(
        &refused(&with_role("{ name: w, command: ['', x] }")),
        "roles[0].command[0]",
        &["empty program name"],
    );
}

#[test]
fn role_env_needs_valid_names_and_leaves_sluice_variables_alone() {
    let sut = parse_yaml(&with_role(
        "{ name: w, command: [x], env: { OMP_NUM_THREADS: 4 } }",
    ))
    .expect("valid env");
    assert_eq!(
        sut.roles[0].env.get("OMP_NUM_THREADS").map(String::as_str),
        Some("4")
    );
    assert_error(
        &refused(&with_role("{ name: w, command: [x], env: { 1BAD: x } }")),
        "roles[0].env.1BAD",
        &["not a valid environment variable name"],
    );
    assert_error(
        &refused(&with_role(
            "{ name: w, command: [x], env: { SLUICE_RANK: 3 } }",
        )),
        "roles[0].env.SLUICE_RANK",
        &["set by the application master", "remove it"],
    );
}

#[test]
fn resources_are_checked_and_memory_units_parsed() {
    let sut = parse_yaml(&with_role(
        "{ name: w, command: [x], resources: { cpu: 0.5, memory: 4Gi, gpu: 1 } }",
    ))
    .expect("valid resources");
    assert_eq!(sut.roles[0].resources.cpu, Some(0.5));
    assert_eq!(sut.roles[0].resources.memory_bytes, Some(4 << 30));
    assert_eq!(sut.roles[0].resources.gpu, 1);
    let sut = parse_yaml(&with_role(
        "{ name: w, command: [x], resources: { memory: 2G } }",
    ))
    .expect("decimal unit");
    assert_eq!(sut.roles[0].resources.memory_bytes, Some(2_000_000_000));
    assert_error(
        &refused(&with_role(
            "{ name: w, command: [x], resources: { cpu: 0 } }",
        )),
        "roles[0].resources.cpu",
        &["positive number of cores"],
    );
    assert_error(
        &refused(&with_role(
            "{ name: w, command: [x], resources: { memory: 4 GB } }",
        )),
        "roles[0].resources.memory",
        &["`4 GB` is not a size", "4Gi"],
    );
}

#[test]
fn restart_policy_and_launcher_kind_are_checked_with_suggestions() {
    let error = refused(&minimal_with("failover: { restart: on_failure }"));
    assert_error(
        &error,
        "failover.restart",
        &["`on_failure`", "did you mean `on-failure`?"],
    );
    let sut = parse_yaml(&minimal_with("failover: { restart: never }")).expect("valid");
    assert_eq!(sut.failover.restart, RestartPolicy::Never);
    let error = refused(&minimal_with("launcher: { kind: kubernets }"));
    assert_error(&error, "launcher.kind", &["did you mean `kubernetes`?"]);
    let sut = parse_yaml(&minimal_with("launcher: { kind: slurm }")).expect("valid");
    assert_eq!(sut.launcher, LauncherKind::Slurm);
}

#[test]
fn slurm_options_are_checked_and_only_taken_by_the_slurm_launcher() {
    let sut = parse_yaml(&minimal_with(
        "launcher: { kind: slurm, partition: gpu-a100, time: \"1-12:00:00\", sbatch: [--account=ml, \"--qos=high\"] }",
    ))
    .expect("valid");
    assert_eq!(
        sut.slurm,
        SlurmSpec {
            partition: Some("gpu-a100".to_owned()),
            time: Some("1-12:00:00".to_owned()),
            sbatch: vec!["--account=ml".to_owned(), "--qos=high".to_owned()],
        }
    );
    for time in ["90", "30:00", "12:00:00", "2-0", "2-12:30", "UNLIMITED"] {
        let sut = parse_yaml(&minimal_with(&format!(
            "launcher: {{ kind: slurm, time: \"{time}\" }}"
        )));
        assert!(sut.is_ok(), "`{time}` is a Slurm time limit: {sut:?}");
    }
    for time in ["", "1h", "1:2:3:4", "-5", "1-", "12:xx"] {
        let error = refused(&minimal_with(&format!(
            "launcher: {{ kind: slurm, time: \"{time}\" }}"
        )));
        assert_error(
            &error,
            "launcher.time",
            &["not a Slurm time limit", "HH:MM:SS"],
        );
    }
    let error = refused(&minimal_with("launcher: { kind: local, partition: gpu }"));
    assert_error(
        &error,
        "launcher.partition",
        &[
            "option of the slurm launcher",
            "`kind` is `local`",
            "set `kind: slurm`",
        ],
    );
    let error = refused(&minimal_with(
        "launcher: { kind: slurm, partition: \"gpu a\" }",
    ));
    assert_error(
        &error,
        "launcher.partition",
        &["not a Slurm partition name"],
    );
    let error = refused(&minimal_with(
        "launcher: { kind: slurm, sbatch: [\"--account=ml\\nrm -rf /\"] }",
    ));
    assert_error(
        &error,
        "launcher.sbatch[0]",
        &["not one sbatch option", "--account=ml"],
    );
    let error = refused(&minimal_with(
        "launcher: { kind: slurm, sbatch: [account=ml] }",
    ));
    assert_error(&error, "launcher.sbatch[0]", &["not one sbatch option"]);
}

#[test]
fn kubernetes_options_are_checked_and_the_image_is_required() {
    let sut = parse_yaml(&minimal_with(
        "launcher: { kind: kubernetes, image: \"ghcr.io/acme/train:1.4\", namespace: ml, node_selector: { gpu: a100 }, tolerations: [{ key: gpu, value: \"yes\", effect: NoSchedule }, { operator: Exists }], image_pull_secrets: [regcred] }",
    ))
    .expect("valid");
    let kubernetes = sut.kubernetes.expect("kubernetes options");
    assert_eq!(kubernetes.image, "ghcr.io/acme/train:1.4");
    assert_eq!(kubernetes.namespace, "ml");
    assert_eq!(kubernetes.node_selector["gpu"], "a100");
    assert_eq!(kubernetes.tolerations[0].operator, "Equal");
    assert_eq!(kubernetes.tolerations[1].key, None);
    assert_eq!(kubernetes.image_pull_secrets, ["regcred"]);
    let sut = parse_yaml(&minimal_with(
        "launcher: { kind: kubernetes, image: train }",
    ))
    .expect("valid");
    assert_eq!(sut.kubernetes.expect("options").namespace, "default");
    let error = refused(&minimal_with("launcher: { kind: kubernetes }"));
    assert_error(
        &error,
        "launcher.image",
        &["is missing", "has `sluice` on its PATH"],
    );
    let error = refused(&minimal_with(
        "launcher: { kind: kubernetes, image: \"a b\" }",
    ));
    assert_error(&error, "launcher.image", &["not a container image name"]);
    let error = refused(&minimal_with(
        "launcher: { kind: kubernetes, image: t, namespace: ML }",
    ));
    assert_error(&error, "launcher.namespace", &["not a Kubernetes name"]);
    let error = refused(&minimal_with(
        "launcher: { kind: kubernetes, image: t, tolerations: [{ key: a, effect: NoSchedul }] }",
    ));
    assert_error(
        &error,
        "launcher.tolerations[0].effect",
        &["did you mean `NoSchedule`?"],
    );
    let error = refused(&minimal_with(
        "launcher: { kind: kubernetes, image: t, tolerations: [{ operator: Exists, value: x }] }",
    ));
    assert_error(&error, "launcher.tolerations[0].value", &["remove `value`"]);
    let error = refused(&minimal_with("launcher: { kind: slurm, image: t }"));
    assert_error(
        &error,
        "launcher.image",
        &[
            "option of the kubernetes launcher",
            "set `kind: kubernetes`",
        ],
    );
    let error = refused(&MINIMAL_YAML.replace(
        "command: [sluice, consume] }",
        "command: [sluice, consume], image: t }",
    ));
    assert_error(
        &error,
        "roles[0].image",
        &["option of the kubernetes launcher"],
    );
    let sut = parse_yaml(&minimal_with(
        "launcher: { kind: kubernetes, image: t, gang: volcano, queue: research }",
    ))
    .expect("valid");
    assert_eq!(
        sut.kubernetes.expect("options").gang,
        Gang::Volcano {
            queue: "research".to_owned()
        }
    );
    let error = refused(&minimal_with(
        "launcher: { kind: kubernetes, image: t, gang: volcanoes }",
    ));
    assert_error(&error, "launcher.gang", &["did you mean `volcano`?"]);
    let error = refused(&minimal_with(
        "launcher: { kind: kubernetes, image: t, queue: q }",
    ));
    assert_error(&error, "launcher.queue", &["set `gang: volcano`"]);
    let kubernetes = minimal_with("launcher: { kind: kubernetes, image: t }");
    let error = refused(&kubernetes.replace("name: small", "name: small_job"));
    assert_error(
        &error,
        "name",
        &["cannot start the names of Kubernetes objects"],
    );
    let error = refused(&kubernetes.replace("name: worker", "name: work.er"));
    assert_error(
        &error,
        "roles[0].name",
        &["cannot start a container's name"],
    );
}

#[test]
fn checkpoint_keep_is_at_least_one() {
    let sut =
        parse_yaml(&minimal_with("checkpoint: { uri: \"file:///c\", keep: 3 }")).expect("valid");
    assert_eq!(sut.checkpoint.expect("checkpoint").keep, Some(3));
    let error = refused(&minimal_with("checkpoint: { uri: \"file:///c\", keep: 0 }"));
    assert_error(&error, "checkpoint.keep", &["is 0", "keep at least 1"]);
}

#[test]
fn relaunches_back_off_exponentially_up_to_a_cap() {
    let sut = parse_yaml(MINIMAL_YAML).expect("valid").failover;
    let waits: Vec<u64> = (1..=8)
        .map(|failures| sut.restart_backoff(failures).as_millis() as u64)
        .collect();
    assert_eq!(waits, [250, 500, 1000, 2000, 4000, 8000, 10_000, 10_000]);
    assert_eq!(
        sut.restart_backoff(u32::MAX).as_millis(),
        10_000,
        "no overflow"
    );
    let sut = parse_yaml(&minimal_with("failover: { restart_backoff_ms: 0 }"))
        .expect("valid")
        .failover;
    assert_eq!(
        sut.restart_backoff(5).as_millis(),
        0,
        "0 relaunches at once"
    );
    let error = refused(&minimal_with(
        "failover: { restart_backoff_max_ms: 99999999999 }",
    ));
    assert_error(
        &error,
        "failover.restart_backoff_max_ms",
        &["at most an hour"],
    );
}

#[test]
fn an_external_launcher_needs_no_trainer_command() {
    let text = "name: a\ndata: {sources: [{uri: 'file:///d', format: parquet}]}\nnodes: 2\nlauncher: { kind: external }\nroles: [{name: worker, num: 4}]\n";
    let sut = parse_yaml(text).expect("valid");
    assert_eq!(sut.launcher, LauncherKind::External);
    assert!(sut.roles[0].command.is_empty());
    let error = refused(&text.replace("launcher: { kind: external }\n", ""));
    assert_error(
        &error,
        "roles[0].command",
        &["is missing", "kind: external"],
    );
}

#[test]
fn hangs_have_defaults_bounds_and_an_action_the_launcher_can_take() {
    let sut = parse_yaml(MINIMAL_YAML).expect("valid");
    assert_eq!(
        sut.failover.hang,
        HangSpec {
            after_s: 300,
            factor: 10.0,
            action: HangAction::Warn,
        }
    );
    // The bound is the larger of the floor and the factor times the recent time between reads.
    assert_eq!(sut.failover.hang.bound_ms(1_000), 300_000);
    assert_eq!(sut.failover.hang.bound_ms(60_000), 600_000);
    let sut = parse_yaml(&minimal_with(
        "failover: { hang: { after_s: 5, factor: 3, action: restart } }",
    ))
    .expect("valid");
    assert_eq!(sut.failover.hang.action, HangAction::Restart);
    assert_eq!(sut.failover.hang.bound_ms(4_000), 12_000);
    assert_error(
        &refused(&minimal_with("failover: { hang: { action: restrat } }")),
        "failover.hang.action",
        &["`restrat`", "did you mean `restart`?"],
    );
    assert_error(
        &refused(&minimal_with("failover: { hang: { after_s: 0 } }")),
        "failover.hang.after_s",
        &["is 0", "use 1 to"],
    );
    assert_error(
        &refused(&minimal_with("failover: { hang: { factor: .nan } }")),
        "failover.hang.factor",
        &["use 1 to 10000"],
    );
    let external = "name: a\ndata: {sources: [{uri: 'file:///d', format: parquet}]}\nlauncher: { kind: external }\nroles: [{name: worker, num: 2}]\nfailover: { hang: { action: restart } }\n";
    assert_error(
        &refused(external),
        "failover.hang.action",
        &["launches nothing to restart", "use `warn` or `fail`"],
    );
    parse_yaml(&external.replace("restart", "fail")).expect("fail needs no launcher");
}

#[test]
fn the_lease_is_shorter_than_the_heartbeat_timeout() {
    let sut = parse_yaml(&minimal_with(
        "failover: { heartbeat_interval_ms: 100, heartbeat_timeout_ms: 2000 }",
    ))
    .expect("valid");
    assert_eq!(sut.failover.lease_ms(), 1_900);
    let sut = parse_yaml(&minimal_with(
        "failover: { heartbeat_interval_ms: 900, heartbeat_timeout_ms: 1000 }",
    ))
    .expect("valid");
    assert_eq!(sut.failover.lease_ms(), 500, "at least half the timeout");
}

#[test]
fn heartbeat_timeout_must_exceed_the_interval() {
    let error = refused(&minimal_with(
        "failover: { heartbeat_interval_ms: 1000, heartbeat_timeout_ms: 1000 }",
    ));
    assert_error(
        &error,
        "failover.heartbeat_timeout_ms",
        &[
            "must be greater than heartbeat_interval_ms (1000)",
            "raise it or lower the interval",
        ],
    );
    let error = refused(&minimal_with("failover: { heartbeat_interval_ms: 5 }"));
    assert_error(&error, "failover.heartbeat_interval_ms", &["10 or more"]);
    let sut = parse_yaml(&minimal_with("failover: { heartbeat_interval_ms: 2000 }"))
        .expect("timeout follows interval");
    assert_eq!(sut.failover.heartbeat_timeout_ms, 20_000);
}

#[test]
fn task_attempts_and_blacklist_threshold_are_bounded() {
    assert_error(
        &refused(&minimal_with("failover: { max_task_attempts: 0 }")),
        "failover.max_task_attempts",
        &["is 0"],
    );
    assert_error(
        &refused(&minimal_with("failover: { max_task_attempts: 5000 }")),
        "failover.max_task_attempts",
        &["at most 1000"],
    );
    assert_error(
        &refused(&minimal_with("failover: { blacklist_after_failures: 0 }")),
        "failover.blacklist_after_failures",
        &["is 0"],
    );
    let sut = parse_yaml(&minimal_with(
        "failover: { max_failures: 5, max_total_failures: 7 }",
    ))
    .expect("valid");
    assert_eq!(sut.failover.blacklist_after_failures, 5);
    assert_eq!(sut.failover.max_total_failures, 7);
}

#[test]
fn percentages_must_lie_in_zero_to_one_hundred() {
    for value in ["0", "100.5", "-3", ".nan"] {
        let error = refused(&minimal_with(&format!(
            "failover: {{ task_success_percent: {value} }}"
        )));
        assert_error(
            &error,
            "failover.task_success_percent",
            &["above 0 and at most 100"],
        );
    }
    let error = refused(&minimal_with("failover: { task_failed_percent: 101 }"));
    assert_error(&error, "failover.task_failed_percent", &["is 101"]);
}

#[test]
fn checkpoint_needs_a_valid_uri_and_interval() {
    assert_error(
        &refused(&minimal_with("checkpoint: { uri: /tmp/ckpt }")),
        "checkpoint.uri",
        &["file:///tmp/ckpt"],
    );
    assert_error(
        &refused(&minimal_with(
            "checkpoint: { uri: 's3://b/ckpt', interval_s: 0 }",
        )),
        "checkpoint.interval_s",
        &["is 0"],
    );
    assert_error(
        &refused(&minimal_with("checkpoint: { interval_s: 5 }")),
        "checkpoint.uri",
        &["is missing"],
    );
}

#[test]
fn sections_must_be_maps_not_lists() {
    let error = refused(&minimal_with("failover: [on-failure, 3]"));
    assert_error(&error, "failover", &["is sequence", "a map of keys"]);
}

/// The minimal spec with `data.transforms` set to `transforms`.
fn with_transforms(transforms: &str) -> String {
    format!(
        "name: small\ndata:\n  sources: [{{ uri: 'file:///d', format: parquet }}]\n  transforms: {transforms}\nroles:\n  - {{ name: worker, command: [sluice, consume] }}\n"
    )
}

#[test]
fn transforms_parse_in_order_with_their_defaults() {
    let sut = parse_yaml(&with_transforms(
        "[{cast: {column: x, to: float32}}, {fill_null: {column: x, value: 0}}, \
         {normalize: {column: x, mean: 0.5, std: 2}}, {hash_bucket: {column: s, buckets: 1000, output: s_bucket}}, \
         {hash_bucket: {column: t, buckets: 7}}]",
    ))
    .expect("valid transforms");
    assert_eq!(
        sut.data.transforms,
        vec![
            TransformSpec::Cast {
                column: "x".to_owned(),
                to: "float32".to_owned()
            },
            TransformSpec::FillNull {
                column: "x".to_owned(),
                value: "0".to_owned()
            },
            TransformSpec::Normalize {
                column: "x".to_owned(),
                mean: 0.5,
                std: 2.0
            },
            TransformSpec::HashBucket {
                column: "s".to_owned(),
                buckets: 1000,
                output: "s_bucket".to_owned()
            },
            TransformSpec::HashBucket {
                column: "t".to_owned(),
                buckets: 7,
                output: "t".to_owned()
            },
        ]
    );
    assert!(!sut.data.fixed_batch_size);
    let fixed =
        parse_yaml(&minimal_with("").replace("data:\n", "data:\n  fixed_batch_size: true\n"))
            .expect("valid");
    assert!(fixed.data.fixed_batch_size);
    assert!(
        parse_yaml(MINIMAL_YAML)
            .expect("valid")
            .data
            .transforms
            .is_empty()
    );
}

#[test]
fn bad_transforms_are_refused_naming_the_key_and_the_fix() {
    let error = refused(&with_transforms("[{cats: {column: x, to: float32}}]"));
    assert_error(&error, "data.transforms[0].cats", &["cast"]);
    let error = refused(&with_transforms(
        "[{cast: {column: x, to: float32, safe: true}}]",
    ));
    assert_error(&error, "data.transforms[0].cast.safe", &["unknown key"]);
    let error = refused(&with_transforms(
        "[{cast: {column: x, to: float32}, normalize: {column: x, mean: 0, std: 1}}]",
    ));
    assert_error(
        &error,
        "data.transforms[0]",
        &["has 2 of the keys", "one step per entry"],
    );
    let error = refused(&with_transforms("[{}]"));
    assert_error(&error, "data.transforms[0]", &["has 0 of the keys"]);
    let error = refused(&with_transforms("[{cast: {column: x, to: float}}]"));
    assert_error(
        &error,
        "data.transforms[0].cast.to",
        &["unknown type `float`", "float16"],
    );
    let error = refused(&with_transforms(
        "[{normalize: {column: x, mean: 0, std: 0}}]",
    ));
    assert_error(
        &error,
        "data.transforms[0].normalize.std",
        &["is 0", "positive"],
    );
    let error = refused(&with_transforms(
        "[{cast: {column: x, to: int64}}, {hash_bucket: {column: s, buckets: 0}}]",
    ));
    assert_error(&error, "data.transforms[1].hash_bucket.buckets", &["is 0"]);
    let error = refused(&with_transforms("[{fill_null: {column: '', value: 1}}]"));
    assert_error(
        &error,
        "data.transforms[0].fill_null.column",
        &["empty column name"],
    );
    let error = refused(&with_transforms("[{fill_null: {column: x}}]"));
    assert_error(&error, "data.transforms[0].fill_null.value", &["missing"]);
}

#[test]
fn absurd_sizes_and_filters_are_refused_naming_the_limit() {
    assert_error(
        &refused(&minimal_with("nodes: 4000000000")),
        "nodes",
        &["is 4000000000", "65536", "at most 65536"],
    );
    assert_error(
        &refused(&with_role(
            "{ name: worker, num: 4000000000, command: [sluice, consume] }",
        )),
        "roles",
        &["4000000000 trainers", "1048576"],
    );
    let two_roles = "name: small\ndata:\n  sources: [{ uri: 'file:///d', format: parquet }]\nroles:\n  - { name: a, num: 1048576, command: [sluice, consume] }\n  - { name: b, num: 1, command: [sluice, consume] }\n";
    assert_error(&refused(two_roles), "roles", &["1048577 trainers"]);
    let deep = format!("{}id = 1{}", "(".repeat(200_000), ")".repeat(200_000));
    assert_error(
        &refused(&with_source(&format!(
            "{{ uri: 'file:///d', format: parquet, filter: '{deep}' }}"
        ))),
        "data.sources[0].filter",
        &["more than 64 deep"],
    );
    let chain = vec!["id = 1"; 100_000].join(" and ");
    assert_error(
        &refused(&with_source(&format!(
            "{{ uri: 'file:///d', format: parquet, filter: '{chain}' }}"
        ))),
        "data.sources[0].filter",
        &["more than 1024 comparisons"],
    );
    let mut bomb = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x]\n");
    for level in 1..10 {
        let previous = format!("*a{}", level - 1);
        bomb.push_str(&format!(
            "a{level}: &a{level} [{}]\n",
            [previous.as_str(); 9].join(", ")
        ));
    }
    let message = refused(&format!("{bomb}{MINIMAL_YAML}")).to_string();
    assert!(message.contains("repetition limit exceeded"), "{message}");
    assert_error(
        &refused(&with_source(
            "{ uri: 'file:///d', format: parquet, filter: 'id >' }",
        )),
        "data.sources[0].filter",
        &["filter syntax error at byte 4"],
    );
}

#[test]
fn a_cache_has_an_absolute_directory_and_a_size_and_is_off_without_one() {
    assert_eq!(parse_yaml(MINIMAL_YAML).expect("valid").data.cache, None);
    let with_cache =
        |cache: &str| minimal_with("").replace("data:\n", &format!("data:\n  cache: {cache}\n"));
    let sut = parse_yaml(&with_cache(
        "{ dir: /var/cache/sluice, max_bytes: 1073741824 }",
    ))
    .expect("valid");
    assert_eq!(
        sut.data.cache,
        Some(CacheSpec {
            dir: "/var/cache/sluice".to_owned(),
            max_bytes: 1 << 30,
        })
    );
    let cases = [
        (
            "{ dir: cache, max_bytes: 1073741824 }",
            "data.cache.dir",
            "absolute",
        ),
        ("{ dir: /c, max_bytes: 0 }", "data.cache.max_bytes", "is 0"),
        ("{ dir: /c }", "data.cache", "max_bytes"),
        ("{ dir: /c, max_bytes: 1, size: 2 }", "data.cache", "size"),
    ];
    for (cache, at, what) in cases {
        let message = refused(&with_cache(cache)).to_string();
        assert!(
            message.contains(at) && message.contains(what),
            "{cache}: {message}"
        );
    }
}

#[test]
fn the_bad_data_policy_is_checked_and_its_budget_only_goes_with_a_policy_that_skips() {
    let with_data = |lines: &str| minimal_with("").replace("data:\n", &format!("data:\n{lines}"));
    let sut = parse_yaml(MINIMAL_YAML).expect("valid");
    assert_eq!(sut.data.bad_data, BadDataSpec::default());
    assert_eq!(sut.data.bad_data.policy, BadDataPolicy::Fail);
    let sut = parse_yaml(&with_data(
        "  on_bad_data: warn\n  max_bad_fraction: 0.05\n",
    ))
    .expect("valid");
    assert_eq!(
        sut.data.bad_data,
        BadDataSpec {
            policy: BadDataPolicy::Warn,
            max_fraction: 0.05
        }
    );
    let sut = parse_yaml(&with_data("  on_bad_data: skip\n")).expect("valid");
    assert_eq!(sut.data.bad_data.max_fraction, 0.01);

    let error = refused(&with_data("  on_bad_data: skipp\n"));
    assert_error(
        &error,
        "data.on_bad_data",
        &["`skipp`", "did you mean `skip`?"],
    );
    let error = refused(&with_data("  max_bad_fraction: 0.1\n"));
    assert_error(
        &error,
        "data.max_bad_fraction",
        &["`fail`", "set data.on_bad_data to `skip` or `warn`"],
    );
    for absurd in ["1.5", "-0.1", ".nan"] {
        let error = refused(&with_data(&format!(
            "  on_bad_data: skip\n  max_bad_fraction: {absurd}\n"
        )));
        assert_error(&error, "data.max_bad_fraction", &["a fraction from 0 to 1"]);
    }
}

#[test]
fn even_batches_is_checked_and_needs_fixed_batch_size() {
    let with_data = |lines: &str| minimal_with("").replace("data:\n", &format!("data:\n{lines}"));
    assert_eq!(
        parse_yaml(MINIMAL_YAML).expect("valid").data.even_batches,
        EvenBatches::Off
    );
    let sut = parse_yaml(&with_data(
        "  fixed_batch_size: true\n  even_batches: pad\n",
    ))
    .expect("valid");
    assert_eq!(sut.data.even_batches, EvenBatches::Pad);
    let error = refused(&with_data(
        "  fixed_batch_size: true\n  even_batches: padd\n",
    ));
    assert_error(
        &error,
        "data.even_batches",
        &["`padd`", "did you mean `pad`?"],
    );
    let sut = parse_yaml(&with_data(
        "  fixed_batch_size: true\n  even_batches: drop\n",
    ))
    .expect("valid");
    assert_eq!(sut.data.even_batches, EvenBatches::Drop);
    let error = refused(&with_data("  even_batches: drop\n"));
    assert_error(&error, "data.even_batches", &["data.fixed_batch_size"]);
    let error = refused(&with_data("  even_batches: pad\n"));
    assert_error(
        &error,
        "data.even_batches",
        &["data.fixed_batch_size", "set data.fixed_batch_size: true"],
    );
}

#[test]
fn the_daemon_section_caps_the_tuning_and_is_checked() {
    assert_eq!(
        parse_yaml(MINIMAL_YAML).expect("valid").daemon,
        DaemonSpec::default()
    );
    let with = |section: &str| format!("{MINIMAL_YAML}daemon: {section}\n");
    let sut =
        parse_yaml(&with("{ max_threads: 4, max_read_ahead_bytes: 268435456 }")).expect("valid");
    assert_eq!(
        sut.daemon,
        DaemonSpec {
            max_threads: Some(4),
            max_read_ahead_bytes: Some(256 << 20)
        }
    );
    let error = refused(&with("{ max_threads: 0 }"));
    assert_error(&error, "daemon.max_threads", &["is 0", "from 1 to 1024"]);
    let error = refused(&with("{ max_read_ahead_bytes: 0 }"));
    assert_error(
        &error,
        "daemon.max_read_ahead_bytes",
        &["no room for a single batch"],
    );
    let error = parse_yaml(&with("{ threads: 4 }")).expect_err("an unknown key");
    assert!(error.to_string().contains("threads"), "{error}");
}

#[test]
fn sources_mixed_by_weight_are_checked() {
    let with_sources = |sources: &str| {
        MINIMAL_YAML.replace(
            r#"  sources: [{ uri: "file:///data/train", format: parquet }]"#,
            &format!("  sources:\n{sources}"),
        )
    };
    let sut = parse_yaml(&with_sources(
        "    - { uri: file:///a, format: parquet, weight: 0.7 }\n    - { uri: file:///b, format: parquet, weight: 0.3, on_exhausted: next_pass }\n",
    ))
    .expect("valid");
    assert_eq!(
        sut.data.sources[0].mix,
        Some(SourceMix {
            weight: 0.7,
            on_exhausted: OnExhausted::EndEpoch
        })
    );
    assert_eq!(
        sut.data.sources[1].mix.map(|mix| mix.on_exhausted),
        Some(OnExhausted::NextPass)
    );
    assert_eq!(
        parse_yaml(MINIMAL_YAML).expect("valid").data.sources[0].mix,
        None
    );

    let error = refused(&with_sources(
        "    - { uri: file:///a, format: parquet, weight: 0.7 }\n    - { uri: file:///b, format: parquet }\n",
    ));
    assert_error(
        &error,
        "data.sources[1].weight",
        &["is missing", "every source a weight"],
    );
    for weight in ["0", "-1", ".nan", ".inf"] {
        let error = refused(&with_sources(&format!(
            "    - {{ uri: file:///a, format: parquet, weight: {weight} }}\n"
        )));
        assert_error(&error, "data.sources[0].weight", &["a positive number"]);
    }
    let error = refused(&with_sources(
        "    - { uri: file:///a, format: parquet, weight: 1, on_exhausted: next_pass }\n",
    ));
    assert_error(&error, "data.sources", &["never end", "end_epoch"]);
    let error = refused(&with_sources(
        "    - { uri: file:///a, format: parquet, weight: 1, on_exhausted: next_pas }\n",
    ));
    assert_error(
        &error,
        "data.sources[0].on_exhausted",
        &["`next_pas`", "did you mean `next_pass`?"],
    );
    let error = refused(&with_sources(
        "    - { uri: file:///a, format: parquet, on_exhausted: next_pass }\n",
    ));
    assert_error(
        &error,
        "data.sources[0].on_exhausted",
        &["without a weight"],
    );
    let error = refused(&with_sources(
        "    - { uri: file:///a, format: parquet, weight: 1, follow: true }\n",
    ));
    assert_error(&error, "data.sources[0].weight", &["followed source"]);
    let error = SourceSpec::parse_added("{ uri: file:///more, format: parquet, weight: 1 }", 2)
        .expect_err("an added source is not mixed");
    assert_error(&error, "data.sources[2].weight", &["fixed when it starts"]);
}

#[test]
fn a_source_added_at_run_time_parses_as_an_entry_of_the_sources_without_follow() {
    let json = r#"{"uri": "s3://bucket/more", "format": "parquet", "columns": ["id"]}"#;
    let sut = SourceSpec::parse_added(json, 2).expect("valid JSON");
    assert_eq!(sut.uri, "s3://bucket/more");
    assert_eq!(sut.columns, Some(vec!["id".to_owned()]));
    let yaml = "uri: file:///data/more.csv\nfollow: false\n";
    let sut = SourceSpec::parse_added(yaml, 2).expect("valid YAML");
    assert_eq!(sut.format, SourceFormat::Csv, "told by the extension");
    // `${NAME}` stays as it was sent: a replaying AM reads the same source.
    let sut = SourceSpec::parse_added("uri: file:///data/${PART}.csv", 2).expect("valid");
    assert_eq!(sut.uri, "file:///data/${PART}.csv");

    let error = SourceSpec::parse_added(
        "{ uri: file:///data/more, format: parquet, follow: true }",
        2,
    )
    .expect_err("follow is refused");
    assert_error(&error, "data.sources[2].follow", &["planned once"]);
    let error =
        SourceSpec::parse_added("uri: file:///data/more", 3).expect_err("no format to tell");
    assert_error(
        &error,
        "data.sources[3].format",
        &["does not tell the format"],
    );
    let error = SourceSpec::parse_added("", 1).expect_err("empty");
    assert_error(&error, "data.sources[1].uri", &["give the source's uri"]);
    let error = SourceSpec::parse_added("{ uri: file:///x.parquet, colums: [id] }", 1)
        .expect_err("a misspelled key");
    assert!(error.to_string().contains("colums"), "{error}");
}
