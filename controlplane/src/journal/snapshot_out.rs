//! A snapshot encoded chunk by chunk, with its header filled in at the end.
//!
//! The encoder writes into one aligned chunk of [`CHUNK`] bytes; each full chunk goes to the
//! target, so a snapshot of ten million tasks (over 100 MiB) never sits whole in memory. A local
//! file is opened with `O_DIRECT` where the file system allows it ([`open_for_snapshot`]): the
//! chunks then go from the chunk to the disk without being copied into the page cache, which cost
//! as much CPU as the encoding itself and took pages the AM's other threads were faulting in.
//!
//! The header holds the body's length and CRC, known only at the end, so the first chunk goes out
//! with a blank header and its first block is written again once the body is complete. Every write
//! starts at a multiple of [`ALIGN`] and is a whole number of blocks, the last one padded with
//! zeros; [`ChunkTarget::finish`] then cuts the target to the snapshot's length.

use std::fs::File;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

use postcard::ser_flavors::Flavor;

use super::frame::{SNAPSHOT_HEADER, SNAPSHOT_MAGIC, snapshot_header};

/// The alignment of the chunk, of every write's offset and of its length: a block of every disk
/// `O_DIRECT` works with.
const ALIGN: usize = 4096;
/// The bytes encoded before they go to the target.
const CHUNK: usize = 1 << 20;

/// Where a snapshot's chunks go.
pub(super) trait ChunkTarget {
    /// Writes `bytes` at `offset`.
    fn write_at(&mut self, offset: u64, bytes: &[u8]) -> std::io::Result<()>;
    /// Cuts the target to `length`, the snapshot's, and makes it durable where it can be.
    fn finish(&mut self, length: u64) -> std::io::Result<()>;
}

impl ChunkTarget for Vec<u8> {
    fn write_at(&mut self, offset: u64, bytes: &[u8]) -> std::io::Result<()> {
        let offset = usize::try_from(offset).map_err(std::io::Error::other)?;
        let end = offset + bytes.len();
        if self.len() < end {
            self.resize(end, 0);
        }
        self[offset..end].copy_from_slice(bytes);
        Ok(())
    }

    fn finish(&mut self, length: u64) -> std::io::Result<()> {
        self.truncate(usize::try_from(length).map_err(std::io::Error::other)?);
        Ok(())
    }
}

impl ChunkTarget for File {
    fn write_at(&mut self, offset: u64, bytes: &[u8]) -> std::io::Result<()> {
        self.write_all_at(bytes, offset)
    }

    fn finish(&mut self, length: u64) -> std::io::Result<()> {
        self.set_len(length)?;
        self.sync_data()
    }
}

/// Creates `path` for a snapshot: with `O_DIRECT`, unless the file system refuses it (tmpfs does),
/// then through the page cache.
pub(super) fn open_for_snapshot(path: &Path) -> std::io::Result<File> {
    let open = |flags| {
        File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .custom_flags(flags)
            .open(path)
    };
    match open(libc::O_DIRECT) {
        Err(error) if error.raw_os_error() == Some(libc::EINVAL) => open(0),
        opened => opened,
    }
}

/// A snapshot being encoded into a [`ChunkTarget`]; a postcard [`Flavor`] through `&mut`.
pub(super) struct SnapshotOut<'target> {
    /// The chunk and the bytes around it that align it: `storage[start..start + CHUNK]`.
    storage: Vec<u8>,
    start: usize,
    /// The bytes of the chunk filled.
    filled: usize,
    /// The bytes written to the target before the chunk.
    written: u64,
    /// The first block as it was written, blank header included.
    first_block: Option<Vec<u8>>,
    /// The CRC-32C of the body written so far.
    body_crc: u32,
    target: &'target mut dyn ChunkTarget,
    /// The first write that failed: later bytes are dropped, and [`SnapshotOut::finish`] returns
    /// it.
    failure: Option<std::io::Error>,
}

impl<'target> SnapshotOut<'target> {
    /// Starts a snapshot in `target`, which must be empty.
    pub(super) fn new(target: &'target mut dyn ChunkTarget) -> SnapshotOut<'target> {
        let storage = vec![0; CHUNK + ALIGN];
        let start = storage.as_ptr().align_offset(ALIGN);
        let mut out = SnapshotOut {
            storage,
            start,
            filled: SNAPSHOT_HEADER,
            written: 0,
            first_block: None,
            body_crc: 0,
            target,
            failure: None,
        };
        out.chunk()[..SNAPSHOT_MAGIC.len()].copy_from_slice(SNAPSHOT_MAGIC);
        out
    }

    /// Appends body bytes.
    pub(super) fn extend(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let room = CHUNK - self.filled;
            let taken = room.min(bytes.len());
            let filled = self.filled;
            self.chunk()[filled..filled + taken].copy_from_slice(&bytes[..taken]);
            self.filled += taken;
            bytes = &bytes[taken..];
            if self.filled == CHUNK {
                self.write_chunk();
            }
        }
    }

    /// Writes what is left, fills in the header of snapshot `sequence` and finishes the target.
    ///
    /// # Errors
    ///
    /// The first write to the target that failed.
    pub(super) fn finish(mut self, sequence: u64) -> std::io::Result<()> {
        if let Some(error) = self.failure.take() {
            return Err(error);
        }
        let length = self.written + self.filled as u64;
        let (filled, written) = (self.filled, self.written);
        let chunk = &mut self.storage[self.start..self.start + CHUNK];
        let body_start = if written == 0 { SNAPSHOT_HEADER } else { 0 };
        let body_crc = crc32c::crc32c_append(self.body_crc, &chunk[body_start..filled]);
        let header = snapshot_header(sequence, length - SNAPSHOT_HEADER as u64, body_crc);
        let padded = filled.next_multiple_of(ALIGN);
        chunk[filled..padded].fill(0);
        if written == 0 {
            chunk[..SNAPSHOT_HEADER].copy_from_slice(&header);
            self.target.write_at(0, &chunk[..padded])?;
        } else {
            self.target.write_at(written, &chunk[..padded])?;
            let first_block = self
                .first_block
                .take()
                .expect("the first chunk was written, and its first block kept");
            chunk[..ALIGN].copy_from_slice(&first_block);
            chunk[..SNAPSHOT_HEADER].copy_from_slice(&header);
            self.target.write_at(0, &chunk[..ALIGN])?;
        }
        self.target.finish(length)
    }

    fn chunk(&mut self) -> &mut [u8] {
        &mut self.storage[self.start..self.start + CHUNK]
    }

    /// Writes the full chunk and starts the next.
    fn write_chunk(&mut self) {
        let body_start = if self.written == 0 {
            SNAPSHOT_HEADER
        } else {
            0
        };
        let chunk = &self.storage[self.start..self.start + CHUNK];
        self.body_crc = crc32c::crc32c_append(self.body_crc, &chunk[body_start..]);
        if self.written == 0 {
            self.first_block = Some(chunk[..ALIGN].to_vec());
        }
        if self.failure.is_none()
            && let Err(error) = self.target.write_at(self.written, chunk)
        {
            self.failure = Some(error);
        }
        self.written += CHUNK as u64;
        self.filled = 0;
    }
}

impl Flavor for &mut SnapshotOut<'_> {
    type Output = ();

    #[inline]
    fn try_push(&mut self, byte: u8) -> postcard::Result<()> {
        let filled = self.filled;
        self.storage[self.start + filled] = byte;
        self.filled += 1;
        if self.filled == CHUNK {
            self.write_chunk();
        }
        Ok(())
    }

    #[inline]
    fn try_extend(&mut self, bytes: &[u8]) -> postcard::Result<()> {
        self.extend(bytes);
        Ok(())
    }

    fn finalize(self) -> postcard::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::frame::{open_snapshot, seal_snapshot, snapshot_buffer};
    use super::*;

    /// The bytes [`seal_snapshot`] makes of `body`.
    fn sealed(body: &[u8], sequence: u64) -> Vec<u8> {
        let mut expected = snapshot_buffer();
        expected.extend_from_slice(body);
        seal_snapshot(&mut expected, sequence);
        expected
    }

    fn body(length: usize) -> Vec<u8> {
        (0..length)
            .map(|index| (index * 7 + index / 251) as u8)
            .collect()
    }

    #[test]
    fn a_snapshot_in_memory_is_the_sealed_buffer_at_every_length_around_the_chunks() {
        for length in [
            0,
            1,
            ALIGN - SNAPSHOT_HEADER,
            ALIGN,
            CHUNK - SNAPSHOT_HEADER - 1,
            CHUNK - SNAPSHOT_HEADER,
            CHUNK - SNAPSHOT_HEADER + 1,
            3 * CHUNK + 5,
        ] {
            let body = body(length);
            let mut target = Vec::new();
            let mut out = SnapshotOut::new(&mut target);
            // Pushed byte by byte and in slices, as postcard does.
            let (bytes, slice) = body.split_at(length / 3);
            for &byte in bytes {
                (&mut out).try_push(byte).expect("pushed");
            }
            (&mut out).try_extend(slice).expect("extended");
            out.finish(9).expect("finished");
            assert_eq!(target, sealed(&body, 9), "a body of {length} bytes");
            assert_eq!(open_snapshot(&target, 9).expect("opens"), &body[..]);
        }
    }

    #[test]
    fn a_snapshot_file_holds_the_sealed_bytes_and_nothing_after_them() {
        let folder = tempfile::tempdir().expect("temporary folder");
        for length in [10, 2 * CHUNK + 100] {
            let path = folder.path().join(format!("{length}.snap"));
            let mut file = open_for_snapshot(&path).expect("created");
            let body = body(length);
            let mut out = SnapshotOut::new(&mut file);
            out.extend(&body);
            out.finish(3).expect("finished");
            assert_eq!(
                std::fs::read(&path).expect("read back"),
                sealed(&body, 3),
                "a body of {length} bytes"
            );
        }
    }

    #[test]
    fn a_failed_write_is_returned_by_finish() {
        /// A target whose every write fails.
        struct Full;
        impl ChunkTarget for Full {
            fn write_at(&mut self, _: u64, _: &[u8]) -> std::io::Result<()> {
                Err(std::io::Error::from_raw_os_error(libc::ENOSPC))
            }
            fn finish(&mut self, _: u64) -> std::io::Result<()> {
                Ok(())
            }
        }
        let mut target = Full;
        let mut out = SnapshotOut::new(&mut target);
        out.extend(&body(CHUNK + 1));
        let error = out.finish(1).expect_err("the write failed");
        assert_eq!(error.raw_os_error(), Some(libc::ENOSPC));
    }
}
