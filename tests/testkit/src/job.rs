//! What a job run on this machine leaves behind, read from outside: the ids files of the reference
//! trainers, the executors' logs, and the processes still naming one of its directories.

use std::path::Path;

/// The live processes other than this one with an argument starting with `path`, and with
/// `subcommand` as their first argument when given (so `daemon` finds `sluice daemon ...`, not the
/// launcher's shim running it).
pub fn processes_naming(path: &Path, subcommand: Option<&str>) -> Vec<u32> {
    let path = path.to_string_lossy().into_owned();
    let own = std::process::id();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(std::result::Result::ok)
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| *pid != own)
        .filter(|pid| {
            let Ok(command_line) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
                return false;
            };
            let arguments: Vec<&[u8]> = command_line.split(|byte| *byte == 0).collect();
            let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let zombie = state
                .rsplit(')')
                .next()
                .is_some_and(|rest| rest.trim_start().starts_with('Z'));
            !zombie
                && subcommand.is_none_or(|name| arguments.get(1) == Some(&name.as_bytes()))
                && arguments
                    .iter()
                    .any(|argument| argument.starts_with(path.as_bytes()))
        })
        .collect()
}

/// The ids a trainer wrote (`sluice consume --ids-out`): little-endian int64s.
pub fn read_ids(path: &Path) -> Vec<i64> {
    std::fs::read(path)
        .unwrap_or_default()
        .chunks_exact(8)
        .map(|chunk| {
            let mut bytes = [0; 8];
            bytes.copy_from_slice(chunk);
            i64::from_le_bytes(bytes)
        })
        .collect()
}

/// One batch a trainer recorded with `sluice consume --ids-out`: the rows of a task it holds,
/// from the row of the task's row order it starts at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadBatch {
    /// The batch's task.
    pub task_id: u64,
    /// The row of the task the batch starts at.
    pub first_row: u64,
    /// The batch's ids, in the order read.
    pub ids: Vec<i64>,
}

/// The batches of an ids file of `sluice consume --ids-out`, in the order read, from the file and
/// the entries of `FILE.positions` beside it (seven little-endian u64s each: the ring's inode, its
/// creator's pid and start ticks, the end of the batch's record, the ids in FILE after the batch,
/// the batch's task and first row; the first entry holds no batch). Empty when either is missing.
pub fn read_batches(path: &Path) -> Vec<ReadBatch> {
    const ENTRY_LEN: usize = 56;
    let ids = read_ids(path);
    let mut positions = path.as_os_str().to_owned();
    positions.push(".positions");
    let entries = std::fs::read(positions).unwrap_or_default();
    let field = |entry: &[u8], index: usize| {
        let mut bytes = [0; 8];
        bytes.copy_from_slice(&entry[index * 8..index * 8 + 8]);
        u64::from_le_bytes(bytes)
    };
    let mut batches = Vec::new();
    let mut start = None;
    for entry in entries.chunks_exact(ENTRY_LEN) {
        let end = usize::try_from(field(entry, 4)).map_or(ids.len(), |end| end.min(ids.len()));
        if let Some(start) = start.filter(|start| *start < end) {
            batches.push(ReadBatch {
                task_id: field(entry, 5),
                first_row: field(entry, 6),
                ids: ids[start..end].to_vec(),
            });
        }
        start = Some(end);
    }
    batches
}

/// Every log the executors left in a state directory, each under its path.
pub fn logs(state: &Path) -> String {
    std::fs::read_dir(state)
        .map(|entries| {
            entries
                .filter_map(std::result::Result::ok)
                .map(|entry| {
                    format!(
                        "--- {}\n{}",
                        entry.path().display(),
                        std::fs::read_to_string(entry.path()).unwrap_or_default()
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_little_endian_int64s() {
        let directory = tempfile::tempdir().expect("tempdir");
        let path = directory.path().join("ids.bin");
        let bytes: Vec<u8> = [3_i64, -1, 1 << 40]
            .iter()
            .flat_map(|id| id.to_le_bytes())
            .chain([7])
            .collect();
        std::fs::write(&path, bytes).expect("write");
        assert_eq!(read_ids(&path), vec![3, -1, 1 << 40]);
    }
}
