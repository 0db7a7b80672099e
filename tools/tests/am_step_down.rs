//! An AM whose journal was taken over steps down: two `sluice am` on one checkpoint location, the
//! second fencing the first. The first refuses the change it can no longer record (a daemon's call
//! gets `unavailable`, so it looks for the AM that took over), and every change after it, and exits
//! non-zero naming the fence, while the second serves the job.

mod common;

use common::{AmProcess, LoggedAm};

#[test]
fn an_am_fenced_by_a_newer_one_refuses_changes_and_exits_naming_the_fence() {
    let directory = tempfile::tempdir().expect("tempdir");
    let root = directory.path();
    let spec = common::one_node_spec(root, "step-down", &root.join("journal"));
    let first = LoggedAm::start(&spec, &root.join("first.err"));
    common::register_node(&first.address, "step-down").expect("the first AM serves");

    let second = AmProcess::start(&spec, "127.0.0.1:0", &[]);
    let refused =
        common::register_node(&first.address, "step-down").expect_err("the first AM was fenced");
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
    assert!(
        refused.message().contains("fenced by a newer writer"),
        "{refused:?}"
    );
    let (succeeded, log) = first.exit();
    assert!(!succeeded, "the fenced AM exits non-zero: {log}");
    assert!(
        log.contains("this AM steps down") && log.contains("fenced by a newer writer"),
        "{log}"
    );
    common::register_node(&second.address, "step-down").expect("the second AM serves the job");
}
