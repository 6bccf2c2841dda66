//! What a Prometheus scraper gets besides egressd's own metrics: the `process_*` metrics every
//! Prometheus client library exports (the same names and units, so the usual dashboards and
//! alerts work), and the text format the scraper asked for.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// `process_cpu_seconds_total`, `process_resident_memory_bytes`, … read from `/proc/self` at
/// each scrape (a few hundred microseconds, off the request path).
#[derive(Debug)]
pub(super) struct ProcessCollector;

/// What `/proc/self` says of the process at one moment.
struct ProcessStats {
    cpu_seconds: f64,
    resident_bytes: u64,
    virtual_bytes: u64,
    start_time_seconds: u64,
    threads: u64,
    open_fds: u64,
    max_fds: Option<u64>,
}

impl ProcessStats {
    fn read() -> Option<ProcessStats> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        // The command name (field 2) is in parentheses and may hold spaces: fields are
        // counted after its closing one, from field 3 (`state`).
        let fields: Vec<&str> = stat.get(stat.rfind(')')? + 2..)?.split(' ').collect();
        let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
        let ticks = rustix::param::clock_ticks_per_second();
        let page = u64::try_from(rustix::param::page_size()).ok()?;
        let boot = boot_time_seconds()?;
        #[allow(clippy::cast_precision_loss)] // CPU ticks stay far below 2^52
        let cpu_seconds = (field(14)? + field(15)?) as f64 / ticks as f64;
        let max_fds = rustix::process::getrlimit(rustix::process::Resource::Nofile).current;
        Some(ProcessStats {
            cpu_seconds,
            resident_bytes: field(24)? * page,
            virtual_bytes: field(23)?,
            start_time_seconds: boot + field(22)? / ticks,
            threads: field(20)?,
            open_fds: u64::try_from(std::fs::read_dir("/proc/self/fd").ok()?.count()).ok()?,
            max_fds,
        })
    }
}

/// When the machine booted (Unix seconds): `/proc/stat`'s `btime`.
fn boot_time_seconds() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    stat.lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(p) = ProcessStats::read() else {
            return Ok(());
        };
        let cpu = ConstCounter::new(p.cpu_seconds);
        cpu.encode(encoder.encode_descriptor(
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds",
            None,
            cpu.metric_type(),
        )?)?;
        let gauges = [
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes",
                Some(p.resident_bytes),
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes",
                Some(p.virtual_bytes),
            ),
            (
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds",
                Some(p.start_time_seconds),
            ),
            (
                "process_threads",
                "Number of OS threads in the process",
                Some(p.threads),
            ),
            (
                "process_open_fds",
                "Number of open file descriptors",
                Some(p.open_fds),
            ),
            (
                "process_max_fds",
                "Maximum number of open file descriptors",
                p.max_fds,
            ),
        ];
        for (name, help, value) in gauges {
            let Some(value) = value.and_then(|v| i64::try_from(v).ok()) else {
                continue;
            };
            let gauge = ConstGauge::new(value);
            gauge.encode(encoder.encode_descriptor(name, help, None, gauge.metric_type())?)?;
        }
        Ok(())
    }
}

/// `Content-Type` of the OpenMetrics text format.
pub(crate) const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// `Content-Type` of the Prometheus text format (0.0.4), for scrapers that do not ask for
/// OpenMetrics (older Prometheus servers, other agents, `curl`).
pub(crate) const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Whether a scraper's `Accept` asks for OpenMetrics (Prometheus sends
/// `application/openmetrics-text;version=1.0.0,…;q=0.5,text/plain;version=0.0.4;q=0.4,…`).
pub(crate) fn wants_openmetrics(accept: Option<&str>) -> bool {
    accept.is_some_and(|a| a.contains("application/openmetrics-text"))
}

/// The OpenMetrics exposition `openmetrics` in the Prometheus text format: a counter's `HELP`
/// and `TYPE` name its `_total` samples, `unknown` is `untyped`, and there is no `# EOF` nor
/// `# UNIT`.
pub(crate) fn to_prometheus_text(openmetrics: &str) -> String {
    let counters: std::collections::HashSet<&str> = openmetrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE ")?.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(openmetrics.len() + counters.len() * 16);
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let comment = ["# HELP ", "# TYPE "]
            .into_iter()
            .find_map(|kind| Some((kind, line.strip_prefix(kind)?)));
        match comment {
            Some((kind, rest)) => {
                let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
                let suffix = if counters.contains(name) {
                    "_total"
                } else {
                    ""
                };
                let tail = if tail == "unknown" { "untyped" } else { tail };
                out.push_str(kind);
                out.push_str(name);
                out.push_str(suffix);
                out.push(' ');
                out.push_str(tail);
            }
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openmetrics_becomes_prometheus_text() {
        let om = "# HELP egressd_requests Requests received.\n# TYPE egressd_requests counter\n\
                  egressd_requests_total 3\n# HELP egressd_up Up.\n# TYPE egressd_up gauge\n\
                  egressd_up 1\n# TYPE x unknown\nx 2\n# EOF\n";
        assert_eq!(
            to_prometheus_text(om),
            "# HELP egressd_requests_total Requests received.\n# TYPE egressd_requests_total counter\n\
             egressd_requests_total 3\n# HELP egressd_up Up.\n# TYPE egressd_up gauge\n\
             egressd_up 1\n# TYPE x untyped\nx 2\n"
        );
    }

    #[test]
    fn the_process_is_read_from_proc() {
        let p = ProcessStats::read().expect("/proc/self");
        assert!(p.resident_bytes > 1 << 20, "{}", p.resident_bytes);
        assert!(p.threads >= 1 && p.open_fds >= 3);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        assert!(p.start_time_seconds <= now && now - p.start_time_seconds < 3600);
    }

    #[test]
    fn only_an_openmetrics_accept_gets_openmetrics() {
        let prometheus = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert!(wants_openmetrics(Some(prometheus)));
        assert!(!wants_openmetrics(Some("*/*")));
        assert!(!wants_openmetrics(None));
    }
}
