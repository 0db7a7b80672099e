//! The figures of a `sluice-bench ring` run, as one JSON object or as tables for people.

use std::fmt::Write as _;

use serde::Serialize;

use crate::affinity::Placement;
use crate::transport::Measurement;

/// Throughput of one transport at one record size.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Figures {
    /// Records per second.
    pub msgs_per_s: f64,
    /// Payload gigabytes (1e9 bytes) per second.
    pub gbps: f64,
}

impl From<Measurement> for Figures {
    fn from(measurement: Measurement) -> Figures {
        Figures {
            msgs_per_s: measurement.msgs_per_s(),
            gbps: measurement.gbps(),
        }
    }
}

/// The baselines' figures at one record size.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Baselines {
    /// A Unix domain stream socket between two processes.
    pub unix_socket: Figures,
    /// A bounded crossbeam channel between two threads.
    pub crossbeam: Figures,
    /// iceoryx2 publish-subscribe between two processes.
    pub iceoryx2: Figures,
}

/// The figures at one record size: the Sluice ring's at the top level, the baselines beside them.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct SizeReport {
    /// The payload bytes of each record.
    pub bytes: usize,
    /// The ring's records per second.
    pub msgs_per_s: f64,
    /// The ring's payload GB/s.
    pub gbps: f64,
    /// The ring's GB/s over the memcpy GB/s of the same run (256 MiB buffers).
    pub ratio_to_memcpy: f64,
    /// The ring's capacity in bytes.
    pub ring_bytes: u64,
    /// Single-thread memcpy GB/s between two buffers of `ring_bytes`: the same working set.
    pub memcpy_working_set_gbps: f64,
    /// The ring's GB/s over `memcpy_working_set_gbps`.
    pub ratio_to_memcpy_working_set: f64,
    /// The same records through a ring larger than the last-level cache; for records of 1 MiB and more.
    pub dram_ring: Option<RingOfSize>,
    /// The producer writing into that ring with its consumer far behind; for records of 1 MiB and
    /// more.
    pub far_behind: Option<FarBehind>,
    /// The baselines.
    pub baselines: Baselines,
}

/// The ring's figures at one record size with a ring of a given capacity.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct RingOfSize {
    /// The ring's capacity in bytes.
    pub ring_bytes: u64,
    /// Records per second.
    pub msgs_per_s: f64,
    /// Payload GB/s.
    pub gbps: f64,
    /// Single-thread memcpy GB/s between two buffers of `ring_bytes`.
    pub memcpy_working_set_gbps: f64,
    /// `gbps` over `memcpy_working_set_gbps`.
    pub ratio_to_memcpy_working_set: f64,
}

/// The producer's figures with its consumer far behind (a trainer that lags), in a ring larger
/// than the last-level cache: the ring's own write, which puts a record that far ahead around the
/// cache, against a plain copy into the same slots.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct FarBehind {
    /// The ring's capacity in bytes.
    pub ring_bytes: u64,
    /// How far behind the consumer is while the producer writes, in bytes.
    pub backlog_bytes: u64,
    /// The producer's payload GB/s through `Slot::write`.
    pub ring_write_gbps: f64,
    /// The producer's payload GB/s through a plain copy into `Slot::payload_mut`.
    pub plain_copy_gbps: f64,
    /// `ring_write_gbps` over `plain_copy_gbps`.
    pub ratio: f64,
}

/// Everything one `sluice-bench ring` run measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RingBenchReport {
    /// Single-thread memcpy bandwidth between two 256 MiB buffers, GB/s.
    pub memcpy_gbps: f64,
    /// One entry per record size, in the order given.
    pub sizes: Vec<SizeReport>,
    /// The cores the two sides ran on; shown in the tables, not part of the JSON contract.
    #[serde(skip)]
    pub placement: Placement,
}

impl RingBenchReport {
    /// The report as one JSON object: `memcpy_gbps` and `sizes`.
    pub fn to_json(&self) -> serde_json::Result<String> {
        serde_json::to_string(self)
    }

    /// The report as one table per record size, for people.
    pub fn render_tables(&self) -> String {
        let mut out = String::new();
        let cores = match (self.placement.consumer, self.placement.producer) {
            (Some(consumer), Some(producer)) => {
                format!("consumer on cpu {consumer}, producer on cpu {producer}")
            }
            _ => "one cpu available: producer and consumer unpinned".to_owned(),
        };
        // Writing to a String cannot fail.
        writeln!(
            out,
            "memcpy, one thread, 256 MiB buffers: {:.2} GB/s",
            self.memcpy_gbps
        )
        .ok();
        writeln!(out, "{cores}").ok();
        for size in &self.sizes {
            writeln!(out).ok();
            writeln!(out, "record size {}", human_bytes(size.bytes)).ok();
            writeln!(
                out,
                "  {:<12} {:>14} {:>9} {:>10} {:>12}",
                "transport", "records/s", "GB/s", "/ memcpy", "ring speedup"
            )
            .ok();
            let ring = Figures {
                msgs_per_s: size.msgs_per_s,
                gbps: size.gbps,
            };
            let rows = [
                ("sluice_ring", ring),
                ("unix_socket", size.baselines.unix_socket),
                ("crossbeam", size.baselines.crossbeam),
                ("iceoryx2", size.baselines.iceoryx2),
            ];
            for (name, figures) in rows {
                writeln!(
                    out,
                    "  {:<12} {:>14} {:>9.2} {:>10.2} {:>11.2}x",
                    name,
                    human_rate(figures.msgs_per_s),
                    figures.gbps,
                    figures.gbps / self.memcpy_gbps,
                    ring.msgs_per_s / figures.msgs_per_s
                )
                .ok();
            }
            writeln!(
                out,
                "  sluice_ring of {}: {:.2} GB/s ÷ memcpy over the same {} {:.2} GB/s = {:.2}",
                human_bytes(usize::try_from(size.ring_bytes).unwrap_or(usize::MAX)),
                size.gbps,
                human_bytes(usize::try_from(size.ring_bytes).unwrap_or(usize::MAX)),
                size.memcpy_working_set_gbps,
                size.ratio_to_memcpy_working_set
            )
            .ok();
            if let Some(dram) = &size.dram_ring {
                writeln!(
                    out,
                    "  sluice_ring of {} (beyond the cache): {} records/s, {:.2} GB/s ÷ memcpy over the same {} {:.2} GB/s = {:.2}",
                    human_bytes(usize::try_from(dram.ring_bytes).unwrap_or(usize::MAX)),
                    human_rate(dram.msgs_per_s),
                    dram.gbps,
                    human_bytes(usize::try_from(dram.ring_bytes).unwrap_or(usize::MAX)),
                    dram.memcpy_working_set_gbps,
                    dram.ratio_to_memcpy_working_set
                )
                .ok();
            }
            if let Some(far) = &size.far_behind {
                writeln!(
                    out,
                    "  producer {} ahead of its consumer in a ring of {}: the ring's write {:.2} GB/s ÷ a plain copy {:.2} GB/s = {:.2}",
                    human_bytes(usize::try_from(far.backlog_bytes).unwrap_or(usize::MAX)),
                    human_bytes(usize::try_from(far.ring_bytes).unwrap_or(usize::MAX)),
                    far.ring_write_gbps,
                    far.plain_copy_gbps,
                    far.ratio
                )
                .ok();
            }
        }
        out
    }
}

fn human_bytes(bytes: usize) -> String {
    match bytes {
        bytes if bytes >= 1 << 20 && bytes % (1 << 20) == 0 => format!("{} MiB", bytes >> 20),
        bytes if bytes >= 1 << 10 && bytes % (1 << 10) == 0 => format!("{} KiB", bytes >> 10),
        bytes => format!("{bytes} B"),
    }
}

fn human_rate(per_second: f64) -> String {
    if per_second >= 1e6 {
        format!("{:.2} M", per_second / 1e6)
    } else if per_second >= 1e3 {
        format!("{:.1} k", per_second / 1e3)
    } else {
        format!("{per_second:.0}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figures(msgs_per_s: f64, gbps: f64) -> Figures {
        Figures { msgs_per_s, gbps }
    }

    fn report() -> RingBenchReport {
        RingBenchReport {
            memcpy_gbps: 10.0,
            sizes: vec![SizeReport {
                bytes: 4096,
                msgs_per_s: 2e6,
                gbps: 8.192,
                ratio_to_memcpy: 0.8192,
                ring_bytes: 8 << 20,
                memcpy_working_set_gbps: 16.384,
                ratio_to_memcpy_working_set: 0.5,
                dram_ring: Some(RingOfSize {
                    ring_bytes: 256 << 20,
                    msgs_per_s: 1e6,
                    gbps: 4.096,
                    memcpy_working_set_gbps: 8.192,
                    ratio_to_memcpy_working_set: 0.5,
                }),
                far_behind: Some(FarBehind {
                    ring_bytes: 256 << 20,
                    backlog_bytes: 32 << 20,
                    ring_write_gbps: 12.0,
                    plain_copy_gbps: 10.0,
                    ratio: 1.2,
                }),
                baselines: Baselines {
                    unix_socket: figures(5e5, 2.048),
                    crossbeam: figures(1e6, 4.096),
                    iceoryx2: figures(4e5, 1.6384),
                },
            }],
            placement: Placement {
                consumer: Some(0),
                producer: Some(1),
            },
        }
    }

    #[test]
    fn json_has_exactly_the_documented_keys() {
        let text = report().to_json().expect("encodable");
        let json: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
        let keys = |value: &serde_json::Value| {
            let mut keys: Vec<String> =
                value.as_object().expect("object").keys().cloned().collect();
            keys.sort();
            keys
        };
        assert_eq!(keys(&json), ["memcpy_gbps", "sizes"]);
        let size = &json["sizes"][0];
        assert_eq!(
            keys(size),
            [
                "baselines",
                "bytes",
                "dram_ring",
                "far_behind",
                "gbps",
                "memcpy_working_set_gbps",
                "msgs_per_s",
                "ratio_to_memcpy",
                "ratio_to_memcpy_working_set",
                "ring_bytes"
            ]
        );
        assert_eq!(
            keys(&size["baselines"]),
            ["crossbeam", "iceoryx2", "unix_socket"]
        );
        assert_eq!(size["bytes"], 4096);
        assert_eq!(size["baselines"]["iceoryx2"]["msgs_per_s"], 4e5);
    }

    #[test]
    fn tables_show_each_transport_with_its_ratios() {
        let tables = report().render_tables();
        assert!(tables.contains("record size 4 KiB"), "{tables}");
        assert!(
            tables.contains("consumer on cpu 0, producer on cpu 1"),
            "{tables}"
        );
        let unix_row = tables
            .lines()
            .find(|line| line.trim_start().starts_with("unix_socket"))
            .expect("unix_socket row");
        assert!(unix_row.contains("500.0 k"), "{unix_row}");
        assert!(unix_row.contains("0.20"), "{unix_row}");
        assert!(unix_row.contains("4.00x"), "{unix_row}");
        assert!(
            tables.contains("sluice_ring of 256 MiB (beyond the cache): 1.00 M records/s, 4.10 GB/s ÷ memcpy over the same 256 MiB 8.19 GB/s = 0.50"),
            "{tables}"
        );
    }

    #[test]
    fn sizes_and_rates_read_naturally() {
        assert_eq!(human_bytes(64), "64 B");
        assert_eq!(human_bytes(65536), "64 KiB");
        assert_eq!(human_bytes(1 << 20), "1 MiB");
        assert_eq!(human_bytes(1000), "1000 B");
        assert_eq!(human_rate(52_345_678.0), "52.35 M");
    }
}
