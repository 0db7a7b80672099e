//! `sluice plan`: prints the tasks a job would get from a source.

use std::io::Write;

use sluice_formats::{Dataset, Expr};

use crate::cmd::read::{open_options, parse_key_value, runtime};

/// Arguments of `sluice plan`.
#[derive(Debug, clap::Args)]
pub struct PlanArgs {
    /// The source: a path or URI of a file, a directory, a glob, or a Delta or Iceberg table.
    pub source: String,
    /// Maximum rows per task.
    #[arg(long, default_value_t = sluice_formats::dataset::DEFAULT_TASK_ROWS)]
    pub task_rows: u64,
    /// Print a JSON array of splits instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Delta table version, or Iceberg snapshot id, to plan.
    #[arg(long)]
    pub version: Option<u64>,
    /// Table timestamp (RFC 3339 or epoch milliseconds): the Delta version or Iceberg snapshot current then.
    #[arg(long)]
    pub timestamp: Option<String>,
    /// The job's row filter: an Iceberg table's files that its partition values and column bounds
    /// prove hold no row that passes are left out, as the job's plan leaves them out.
    #[arg(long)]
    pub filter: Option<String>,
    /// Format of the source when it cannot be told from _delta_log, Iceberg metadata or file
    /// extensions.
    #[arg(long)]
    pub format: Option<String>,
    /// Object store setting overriding the environment, as key=value (repeatable).
    #[arg(long = "storage-option", value_parser = parse_key_value)]
    pub storage_options: Vec<(String, String)>,
}

/// Runs `sluice plan`, printing to stdout.
pub fn run(args: PlanArgs) -> anyhow::Result<()> {
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    plan_to(&args, &mut out)?;
    out.flush()?;
    Ok(())
}

/// Runs `sluice plan`, writing its output to `out`.
pub fn plan_to(args: &PlanArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    runtime(2)?.block_on(async {
        let mut options = open_options(
            &args.storage_options,
            args.format.as_deref(),
            args.version,
            args.timestamp.clone(),
        )?;
        options.filter = args.filter.as_deref().map(Expr::parse).transpose()?;
        let dataset = Dataset::open(&args.source, &options).await?;
        let splits = dataset.plan(args.task_rows).await?;
        if args.json {
            serde_json::to_writer(&mut *out, &splits)?;
            writeln!(out)?;
        } else {
            writeln!(
                out,
                "{:>8}  {:>12}  {:>10}  uri",
                "task_id", "first_row", "row_count"
            )?;
            for split in &splits {
                writeln!(
                    out,
                    "{:>8}  {:>12}  {:>10}  {}",
                    split.task_id, split.first_row, split.row_count, split.uri
                )?;
            }
            let rows: u64 = splits.iter().map(|split| split.row_count).sum();
            let version = dataset
                .table_version()
                .map(|version| format!(", delta version {version}"))
                .unwrap_or_default();
            writeln!(
                out,
                "{} tasks, {rows} rows, {} files{version}",
                splits.len(),
                dataset.file_count()
            )?;
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, clap::Parser)]
    struct Cli {
        #[command(flatten)]
        plan: PlanArgs,
    }

    #[test]
    fn plan_json_lists_splits_that_cover_the_generated_rows() {
        let directory =
            std::env::temp_dir().join(format!("sluice-plan-test-{}", std::process::id()));
        let out = directory.to_string_lossy().into_owned();
        let gen_args = crate::cmd::r#gen::GenArgs {
            out: out.clone(),
            rows: 2500,
            files: 3,
            format: "delta".to_string(),
            row_group_rows: 400,
            seed: 5,
            storage_options: Vec::new(),
        };
        crate::cmd::r#gen::run(gen_args).expect("gen");
        let cli = Cli::try_parse_from(["plan", out.as_str(), "--task-rows", "500", "--json"])
            .expect("args");
        let mut buffer = Vec::new();
        plan_to(&cli.plan, &mut buffer).expect("plan");
        let splits: serde_json::Value = serde_json::from_slice(&buffer).expect("json array");
        let splits = splits.as_array().expect("array").clone();
        let mut rows = 0;
        for (index, split) in splits.iter().enumerate() {
            assert_eq!(split["task_id"], index);
            assert!(
                split["uri"]
                    .as_str()
                    .is_some_and(|uri| uri.starts_with("file://") && uri.ends_with(".parquet"))
            );
            assert!(split["first_row"].is_u64());
            assert_eq!(split["delta"]["version"], 0);
            rows += split["row_count"].as_u64().expect("row_count");
        }
        assert_eq!(rows, 2500);
        let text_cli =
            Cli::try_parse_from(["plan", out.as_str(), "--task-rows", "500"]).expect("args");
        let mut text = Vec::new();
        plan_to(&text_cli.plan, &mut text).expect("plan");
        let text = String::from_utf8(text).expect("utf-8");
        assert!(
            text.trim_end().ends_with(&format!(
                "{} tasks, 2500 rows, 3 files, delta version 0",
                splits.len()
            )),
            "{text}"
        );
        std::fs::remove_dir_all(&directory).expect("clean up");
    }
}
