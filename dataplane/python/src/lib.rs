//! `sluice._native`: the native half of the `sluice` Python package.
//!
//! It reads a ring's records in place and hands Python the address and length of each payload;
//! pyarrow decodes the Arrow IPC message there, with no copy. Every record is held as a
//! [`sluice_ring::Lease`], so Python decides when it is released: the pure-Python reader releases a
//! batch when the next one is asked for, unless the user took a lease on it. A [`Record`] also keeps
//! the ring mapped, so a pyarrow buffer whose base is the record stays readable memory even after the
//! record was released (its bytes may then hold a later record).
//!
//! The module links the ring alone: the package's pure-Python half commits and restores data
//! checkpoints on the AM, as JSON over HTTP with Python's standard library.

#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use pyo3::create_exception;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use sluice_ring::{Consumer, Lease, RecordKind, Ring, TryRecvError};

create_exception!(
    _native,
    SluiceError,
    PyRuntimeError,
    "An error of the Sluice data plane: a ring that cannot be read, a daemon that reported an error or went away, or an AM that cannot be reached or refused a call."
);

/// How often a reader waiting for its ring file to be created looks again.
const POLL: Duration = Duration::from_millis(20);

/// What `Reader.next` returns for one record.
type NextRecord = (Py<Record>, &'static str, u64, u64, u64, usize, usize);

/// The consumer of one ring.
#[pyclass(module = "sluice._native")]
struct Reader {
    ring: Ring,
    consumer: Consumer,
}

#[pymethods]
impl Reader {
    /// Opens the ring at `path` and takes its consumer role. Waits up to `wait_s` for the node
    /// daemon to create the ring; `next` waits up to `peer_timeout_s` for a daemon that is gone.
    #[new]
    #[pyo3(signature = (path, wait_s, peer_timeout_s))]
    fn new(py: Python<'_>, path: PathBuf, wait_s: f64, peer_timeout_s: f64) -> PyResult<Reader> {
        let wait = seconds(wait_s, "wait_s")?;
        let peer_timeout = seconds(peer_timeout_s, "peer_timeout_s")?;
        let ring = open_when_created(py, &path, wait)?;
        let mut consumer = ring.consumer().map_err(|error| {
            SluiceError::new_err(format!(
                "ring {}: taking the consumer role: {error}",
                path.display()
            ))
        })?;
        consumer.set_peer_timeout(peer_timeout);
        Ok(Reader { ring, consumer })
    }

    /// The next record, held until it is released or dropped, as `(record, kind, position,
    /// task_id, end_row, address, size)` (one call per record rather than one per field; see
    /// [`Record`] for the fields); `None` once the daemon closed the ring. Waits (without the GIL)
    /// while the ring is empty.
    fn next(&mut self, py: Python<'_>) -> PyResult<Option<NextRecord>> {
        let consumer = &mut self.consumer;
        let next = py.detach(|| {
            consumer
                .next()
                .map(|record| record.map(sluice_ring::Record::lease))
        });
        match next.map_err(|error| SluiceError::new_err(error.to_string()))? {
            Some(lease) => self.hand_out(py, lease).map(Some),
            None => Ok(None),
        }
    }

    /// The next record as [`Reader::next`] gives it if the daemon has published one, without
    /// waiting; `None` when the ring is empty now or closed (`next` then waits, or tells which).
    /// A reader holding records calls it first, so that it can release them before it waits: the
    /// daemon may need their room for the next record.
    fn try_next(&mut self, py: Python<'_>) -> PyResult<Option<NextRecord>> {
        let next = self.consumer.try_next().map(sluice_ring::Record::lease);
        match next {
            Ok(lease) => self.hand_out(py, lease).map(Some),
            Err(TryRecvError::Empty | TryRecvError::Closed) => Ok(None),
            Err(error) => Err(SluiceError::new_err(error.to_string())),
        }
    }

    /// The end of the released prefix, in bytes since the ring was created: a record whose
    /// `position` lies below it is consumed.
    fn position(&self) -> u64 {
        self.consumer.position()
    }

    /// The address range `(start, end)` of the ring's data region in this process.
    fn data_region(&self) -> (usize, usize) {
        let region = self.consumer.data_region();
        (region.start, region.end)
    }

    /// The ring's published write and read cursors `(write, read)`, in bytes since its creation: what
    /// the daemon wrote, and what it sees released.
    fn cursors(&self) -> (u64, u64) {
        self.ring.cursors()
    }

    /// The seconds this reader spent waiting on an empty ring.
    #[getter]
    fn empty_wait_s(&self) -> f64 {
        self.consumer.empty_wait().as_secs_f64()
    }

    /// The ring's path.
    #[getter]
    fn path(&self) -> PathBuf {
        self.ring.path().to_path_buf()
    }

    /// The inode of the ring's file as it was opened, which a ring that replaced it does not share.
    #[getter]
    fn inode(&self) -> u64 {
        self.ring.inode()
    }
}

impl Reader {
    /// The tuple `next` returns for `lease`, whose record becomes a Python [`Record`].
    fn hand_out(&self, py: Python<'_>, lease: Lease) -> PyResult<NextRecord> {
        let meta = lease.meta();
        let position = lease.position();
        let payload = lease.payload();
        let (address, size) = (payload.as_ptr() as usize, payload.len());
        let kind = kind_name(meta.kind);
        let record = Py::new(
            py,
            Record {
                ring: self.ring.clone(),
                kind,
                lease: Some(lease),
            },
        )?;
        Ok((
            record,
            kind,
            position,
            meta.task_id,
            meta.first_row + meta.row_count,
            address,
            size,
        ))
    }
}

/// One record of the ring, held in place until [`Record::release`] or until it is dropped.
#[pyclass(module = "sluice._native")]
struct Record {
    /// Keeps the mapping alive for as long as Python holds the record, released or not.
    ring: Ring,
    kind: &'static str,
    lease: Option<Lease>,
}

impl Record {
    fn lease(&self) -> PyResult<&Lease> {
        self.lease.as_ref().ok_or_else(|| {
            SluiceError::new_err(format!(
                "ring {}: this record was released; take a lease before reading on to keep it",
                self.ring.path().display()
            ))
        })
    }
}

#[pymethods]
impl Record {
    /// `"schema"`, `"batch"`, `"end_of_epoch"` or `"error"`.
    #[getter]
    fn kind(&self) -> &'static str {
        self.kind
    }

    /// The task the batch's rows belong to.
    #[getter]
    fn task_id(&self) -> PyResult<u64> {
        Ok(self.lease()?.meta().task_id)
    }

    /// The split row of the first row the batch covers.
    #[getter]
    fn first_row(&self) -> PyResult<u64> {
        Ok(self.lease()?.meta().first_row)
    }

    /// The split rows the batch covers (rows a filter removed included).
    #[getter]
    fn row_count(&self) -> PyResult<u64> {
        Ok(self.lease()?.meta().row_count)
    }

    /// The record's sequence number in the ring.
    #[getter]
    fn sequence(&self) -> PyResult<u64> {
        Ok(self.lease()?.sequence())
    }

    /// The record's byte position in the ring's stream.
    #[getter]
    fn position(&self) -> PyResult<u64> {
        Ok(self.lease()?.position())
    }

    /// The address of the payload in this process.
    #[getter]
    fn address(&self) -> PyResult<usize> {
        Ok(self.lease()?.payload().as_ptr() as usize)
    }

    /// The payload's length in bytes.
    #[getter]
    fn size(&self) -> PyResult<usize> {
        Ok(self.lease()?.payload().len())
    }

    /// A copy of the payload.
    fn to_bytes(&self) -> PyResult<Vec<u8>> {
        Ok(self.lease()?.payload().to_vec())
    }

    /// Tells whether the record was released.
    #[getter]
    fn released(&self) -> bool {
        self.lease.is_none()
    }

    /// Gives the record's bytes back to the daemon; the second call does nothing.
    fn release(&mut self) {
        self.lease = None;
    }
}

fn kind_name(kind: RecordKind) -> &'static str {
    match kind {
        RecordKind::Schema => "schema",
        RecordKind::Batch => "batch",
        RecordKind::EndOfEpoch => "end_of_epoch",
        RecordKind::Error => "error",
        RecordKind::Dropped => "dropped",
    }
}

fn seconds(value: f64, name: &str) -> PyResult<Duration> {
    Duration::try_from_secs_f64(value).map_err(|_| {
        SluiceError::new_err(format!(
            "{name} = {value}: expected a number of seconds, zero or more"
        ))
    })
}

/// Opens the ring at `path`, waiting up to `limit` for the daemon to create it. Only an absent
/// file is waited for: the daemon links a ring into place whole, so any other failure is final.
fn open_when_created(py: Python<'_>, path: &Path, limit: Duration) -> PyResult<Ring> {
    let started = Instant::now();
    loop {
        match Ring::open(path) {
            Ok(ring) => return Ok(ring),
            Err(error) if error.is_absent() && started.elapsed() < limit => {
                py.check_signals()?;
                py.detach(|| std::thread::sleep(POLL));
            }
            Err(error) if error.is_absent() => {
                return Err(SluiceError::new_err(format!(
                    "no ring at {} after {:.1} s; check SLUICE_RING (or the ring argument) and that the node daemon runs",
                    path.display(),
                    limit.as_secs_f64()
                )));
            }
            Err(error) => return Err(SluiceError::new_err(error.to_string())),
        }
    }
}

#[pymodule]
fn _native(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<Reader>()?;
    module.add_class::<Record>()?;
    module.add("SluiceError", module.py().get_type::<SluiceError>())?;
    Ok(())
}
