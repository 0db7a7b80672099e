//! The AM's API made private: TLS on the gRPC port (with its JSON calls) and on the status page, a
//! client CA that daemons must present a certificate of, and the bad setups named with their fix:
//! a wrong CA, plain TCP against TLS, TLS against plain TCP, a wrong token, a missing daemon
//! certificate, a public address without TLS.

mod common;

use std::path::Path;
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use common::{AmProcess, generate, sluice, write_spec};
use sluice_testkit::job::read_ids;
use sluice_testkit::pki::{self, Pki};

const TOKEN: &str = "tls-test-token";
const ROWS: u64 = 6_000;

fn spec(data: &Path) -> String {
    format!(
        "name: private\n\
         data:\n  sources: [{{ uri: \"file://{}\", format: parquet, columns: [id] }}]\n  task_rows: 1000\n  batch_size: 250\n\
         launcher: {{ kind: external }}\n\
         roles:\n  - {{ name: worker, num: 1 }}\n\
         failover: {{ heartbeat_interval_ms: 100, heartbeat_timeout_ms: 5000 }}\n",
        data.display()
    )
}

/// `sluice am` serving TLS with `pki`'s server certificate, a token, and daemons' certificates
/// checked against `pki`'s CA.
fn tls_am(spec: &Path, pki: &Pki) -> AmProcess {
    AmProcess::start(
        spec,
        "127.0.0.1:0",
        &[
            "--token",
            TOKEN,
            "--tls-cert",
            pki.server_cert.to_str().expect("utf-8 path"),
            "--tls-key",
            pki.server_key.to_str().expect("utf-8 path"),
            "--tls-client-ca",
            pki.ca.to_str().expect("utf-8 path"),
            "--http",
            "127.0.0.1:0",
        ],
    )
}

/// `sluice status` against `am` with `ca` and `token`, as it exits.
fn status(am: &str, ca: Option<&Path>, token: Option<&str>) -> Output {
    let mut command = sluice();
    command
        .args(["status", "--json", "--am", am])
        .env_remove("SLUICE_TOKEN")
        .env_remove("SLUICE_TLS_CA");
    if let Some(ca) = ca {
        command.arg("--tls-ca").arg(ca);
    }
    if let Some(token) = token {
        command.args(["--token", token]);
    }
    command.output().expect("run sluice status")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn port(address: &str) -> &str {
    address.rsplit(':').next().expect("host:port")
}

#[test]
fn a_private_am_serves_the_right_clients_and_names_every_wrong_setup() {
    let directory = tempfile::tempdir().expect("tempdir");
    let pki = pki::write(directory.path(), &["localhost", "127.0.0.1"]);
    let data = generate(directory.path(), ROWS, 2, 500);
    let spec = write_spec(directory.path(), &spec(&data));
    let am = tls_am(&spec, &pki);
    let https = format!("https://localhost:{}", port(&am.address));

    let ok = status(&https, Some(&pki.ca), Some(TOKEN));
    assert!(ok.status.success(), "{}", stderr(&ok));
    let bare = format!("localhost:{}", port(&am.address));
    let ok = status(&bare, Some(&pki.ca), Some(TOKEN));
    assert!(
        ok.status.success(),
        "a CA makes host:port TLS: {}",
        stderr(&ok)
    );

    let wrong_ca = status(&https, Some(&pki.other_ca), Some(TOKEN));
    assert!(!wrong_ca.status.success());
    assert!(
        stderr(&wrong_ca).contains("--tls-ca"),
        "{}",
        stderr(&wrong_ca)
    );

    let plain = status(&format!("http://{}", am.address), None, Some(TOKEN));
    assert!(!plain.status.success());
    assert!(stderr(&plain).contains("https://"), "{}", stderr(&plain));

    let no_token = status(&https, Some(&pki.ca), None);
    assert!(!no_token.status.success());
    assert!(
        stderr(&no_token).contains("SLUICE_TOKEN"),
        "{}",
        stderr(&no_token)
    );

    // The status page is HTTPS with the same certificate, and its API wants the token.
    let page = format!(
        "https://localhost:{}",
        port(am.http.as_deref().expect("--http"))
    );
    let fetch = |token: &str| {
        let script = "import json, ssl, sys, urllib.request, urllib.error\n\
            context = ssl.create_default_context(cafile=sys.argv[2])\n\
            request = urllib.request.Request(sys.argv[1], headers={'Authorization': 'Bearer ' + sys.argv[3]})\n\
            try:\n    print(json.load(urllib.request.urlopen(request, context=context))['job'])\n\
            except urllib.error.HTTPError as error:\n    print(error.code)\n";
        let output = std::process::Command::new("python3")
            .args(["-c", script, &format!("{page}/api/status")])
            .arg(&pki.ca)
            .arg(token)
            .output()
            .expect("run python3");
        assert!(output.status.success(), "{}", stderr(&output));
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    };
    assert_eq!(fetch(TOKEN), "private");
    assert_eq!(fetch("wrong"), "401");

    // The token alone does not make a daemon: the AM asks daemons for a certificate.
    let without_cert = sluice()
        .args(["daemon", "--am", &https, "--am-timeout-s", "5"])
        .arg("--tls-ca")
        .arg(&pki.ca)
        .arg("--ring-dir")
        .arg(directory.path().join("rings-refused"))
        .env("SLUICE_TOKEN", TOKEN)
        .env_remove("SLUICE_TLS_CERT")
        .env_remove("SLUICE_TLS_KEY")
        .output()
        .expect("run sluice daemon");
    assert!(!without_cert.status.success());
    assert!(
        stderr(&without_cert).contains("--tls-cert"),
        "{}",
        stderr(&without_cert)
    );

    // With its certificate it serves the job, and a trainer reads every row through TLS.
    let rings = directory.path().join("rings");
    let mut daemon = sluice()
        .args(["daemon", "--am", &https])
        .args(common::daemon_tls_args(&pki))
        .arg("--ring-dir")
        .arg(&rings)
        .env("SLUICE_TOKEN", TOKEN)
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn sluice daemon");
    let ids = directory.path().join("ids.bin");
    let trainer = sluice()
        .args(["consume", "--ids-out"])
        .arg(&ids)
        .env_remove("SLUICE_RING")
        .env("SLUICE_AM", &https)
        .env("SLUICE_TLS_CA", &pki.ca)
        .env("SLUICE_TOKEN", TOKEN)
        .env("SLUICE_RING_DIR", &rings)
        .env("SLUICE_RANK", "0")
        .env("SLUICE_WORLD_SIZE", "1")
        .stdout(Stdio::null())
        .output()
        .expect("run sluice consume");
    assert!(trainer.status.success(), "{}", stderr(&trainer));
    let (succeeded, rest) = am.finish();
    assert!(succeeded, "{rest}");
    let started = Instant::now();
    while daemon.try_wait().expect("try_wait").is_none() {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the daemon did not exit"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut seen = read_ids(&ids);
    seen.sort_unstable();
    assert_eq!(seen, (0..ROWS as i64).collect::<Vec<_>>(), "every row once");
}

#[test]
fn tls_against_a_plain_am_is_named() {
    let directory = tempfile::tempdir().expect("tempdir");
    let pki = pki::write(directory.path(), &["localhost"]);
    let data = generate(directory.path(), 1000, 1, 500);
    let spec = write_spec(directory.path(), &spec(&data));
    let am = AmProcess::start(&spec, "127.0.0.1:0", &[]);
    let output = status(
        &format!("https://localhost:{}", port(&am.address)),
        Some(&pki.ca),
        None,
    );
    assert!(!output.status.success());
    assert!(
        stderr(&output).contains("does not speak TLS"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn a_public_address_without_tls_and_a_token_is_refused_naming_insecure() {
    let directory = tempfile::tempdir().expect("tempdir");
    let data = generate(directory.path(), 1000, 1, 500);
    let spec = write_spec(directory.path(), &spec(&data));
    let output = sluice()
        .arg("am")
        .arg(&spec)
        .args(["--listen", "0.0.0.0:0"])
        .env_remove("SLUICE_TOKEN")
        .output()
        .expect("run sluice am");
    assert!(!output.status.success());
    let message = stderr(&output);
    assert!(
        message.contains("--insecure") && message.contains("--tls-cert"),
        "{message}"
    );
}
