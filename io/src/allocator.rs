//! The allocator settings decoding and local reads are fast under, for the binaries to set at start.

/// Allocations up to this size come from glibc's heap instead of fresh mappings (its largest setting).
#[cfg(target_env = "gnu")]
const MMAP_THRESHOLD_BYTES: libc::c_int = 32 << 20;
/// Free memory at the top of glibc's heap that is kept rather than returned to the kernel.
#[cfg(target_env = "gnu")]
const TRIM_THRESHOLD_BYTES: libc::c_int = 1 << 30;

/// Keeps freed buffers of up to 32 MiB in the process. Decoding and local reads allocate and free buffers of
/// megabytes for every batch and range; by default glibc maps the larger ones fresh each time and returns
/// freed memory at the top of the heap to the kernel, so each buffer costs page faults and zeroing of every
/// page again. `sluice` and `sluice-bench` call it first in `main`, so that the reads `sluice-bench`
/// measures in its own process run as they do in `sluice`. Elsewhere than on glibc it does nothing.
pub fn keep_freed_buffers() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only sets two of glibc's allocator parameters, under the allocator's own lock
    // (glibc documents it MT-Safe); it touches no memory of the caller.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES);
        libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES);
    }
}
