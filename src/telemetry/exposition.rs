//! What `GET /metrics` sends: the registry in the format the scraper asks for, with the
//! `process_*` families every Prometheus client library adds.
//!
//! Data flows one way: the registry's OpenMetrics text ([`super::Metrics::render`]) + the
//! process families read from `/proc` at the scrape ([`process_families`]) → either as is
//! (`Accept: application/openmetrics-text`, what Prometheus asks for first) or converted to
//! the Prometheus text format 0.0.4 ([`to_text`]) for everything else: `curl`, `promtool check
//! metrics`, exporters and agents that only read the older format. The two differ in three
//! things here: a counter's family is named with its `_total` in the text format, there is no
//! `# UNIT` line, and no `# EOF`.

/// The exposition format of one answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    OpenMetrics,
    Text,
}

impl Format {
    /// OpenMetrics when the scraper names it in its `Accept` header, else the text format.
    pub fn from_accept(accept: Option<&str>) -> Format {
        match accept {
            Some(a) if a.contains("application/openmetrics-text") => Format::OpenMetrics,
            _ => Format::Text,
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
            Format::Text => "text/plain; version=0.0.4; charset=utf-8",
        }
    }
}

/// `openmetrics` with the process families added before its `# EOF`, in `format`.
pub fn render(openmetrics: &str, format: Format) -> String {
    let body = openmetrics.strip_suffix("# EOF\n").unwrap_or(openmetrics);
    let mut out = String::with_capacity(body.len() + 1024);
    out.push_str(body);
    out.push_str(&process_families());
    match format {
        Format::OpenMetrics => {
            out.push_str("# EOF\n");
            out
        }
        Format::Text => to_text(&out),
    }
}

/// OpenMetrics text (without `# EOF`) as the Prometheus text format 0.0.4.
pub fn to_text(openmetrics: &str) -> String {
    // A family's metadata comes before its samples: HELP, TYPE, UNIT. The HELP line is held
    // until the TYPE says whether the family's name takes `_total`.
    let mut out = String::with_capacity(openmetrics.len());
    let mut help: Option<(&str, &str)> = None;
    for line in openmetrics.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, text) = rest.split_once(' ').unwrap_or((rest, ""));
            help = Some((name, text));
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, "untyped"));
            let (family, kind) = match kind {
                "counter" => (format!("{name}_total"), "counter"),
                "info" => (format!("{name}_info"), "gauge"),
                "unknown" => (name.to_string(), "untyped"),
                other => (name.to_string(), other),
            };
            if let Some((help_name, text)) = help.take()
                && help_name == name
            {
                out.push_str(&format!("# HELP {family} {text}\n"));
            }
            out.push_str(&format!("# TYPE {family} {kind}\n"));
        } else if line.starts_with("# UNIT ") || line == "# EOF" {
        } else if line.starts_with('#') {
            out.push_str(line);
            out.push('\n');
        } else if !line.is_empty() {
            // An exemplar (` # {…} value`) is OpenMetrics only.
            let sample = line.split(" # {").next().unwrap_or(line);
            out.push_str(sample);
            out.push('\n');
        }
    }
    out
}

/// The `process_*` families of the Prometheus client libraries (Linux, from `/proc`): CPU
/// seconds, resident and virtual memory, open and most file descriptors, start time. Dashboards
/// built for the reference (Envoy Gateway's) chart `process_resident_memory_bytes`. Empty
/// where `/proc` cannot be read.
pub fn process_families() -> String {
    let Some(p) = Process::read() else {
        return String::new();
    };
    let mut out = String::new();
    let mut family = |name: &str, kind: &str, help: &str, sample: String| {
        out.push_str(&format!(
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{sample}\n"
        ));
    };
    family(
        "process_cpu_seconds",
        "counter",
        "Total user and system CPU time spent in seconds.",
        format!("process_cpu_seconds_total {}", p.cpu_seconds),
    );
    family(
        "process_resident_memory_bytes",
        "gauge",
        "Resident memory size in bytes.",
        format!("process_resident_memory_bytes {}", p.resident_bytes),
    );
    family(
        "process_virtual_memory_bytes",
        "gauge",
        "Virtual memory size in bytes.",
        format!("process_virtual_memory_bytes {}", p.virtual_bytes),
    );
    family(
        "process_open_fds",
        "gauge",
        "Number of open file descriptors.",
        format!("process_open_fds {}", p.open_fds),
    );
    if let Some(max) = p.max_fds {
        family(
            "process_max_fds",
            "gauge",
            "Maximum number of open file descriptors.",
            format!("process_max_fds {max}"),
        );
    }
    if let Some(start) = p.start_time_seconds {
        family(
            "process_start_time_seconds",
            "gauge",
            "Start time of the process since unix epoch in seconds.",
            format!("process_start_time_seconds {start}"),
        );
    }
    out
}

/// This process as `/proc` shows it.
struct Process {
    cpu_seconds: f64,
    resident_bytes: u64,
    virtual_bytes: u64,
    open_fds: usize,
    max_fds: Option<u64>,
    start_time_seconds: Option<u64>,
}

impl Process {
    fn read() -> Option<Process> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        // The command name (field 2) is in parentheses and may hold spaces: the fields that
        // follow start after its closing one. Fields 14, 15 are utime and stime (clock
        // ticks), 22 the start (ticks after boot), 23 vsize (bytes), 24 rss (pages).
        let after = &stat[stat.rfind(')')? + 2..];
        let fields: Vec<&str> = after.split_whitespace().collect();
        let field = |n: usize| -> Option<u64> { fields.get(n - 3)?.parse().ok() };
        let ticks = rustix::param::clock_ticks_per_second().max(1) as f64;
        let page = rustix::param::page_size() as u64;
        let boot = std::fs::read_to_string("/proc/stat").ok().and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("btime ")?.trim().parse::<u64>().ok())
        });
        let max_fds = std::fs::read_to_string("/proc/self/limits")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("Max open files"))?
                    .split_whitespace()
                    .nth(3)?
                    .parse()
                    .ok()
            });
        Some(Process {
            cpu_seconds: (field(14)? + field(15)?) as f64 / ticks,
            resident_bytes: field(24)? * page,
            virtual_bytes: field(23)?,
            open_fds: std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count()),
            max_fds,
            start_time_seconds: boot.zip(field(22)).map(|(b, t)| b + t / ticks as u64),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_format_names_counters_with_total_and_has_no_unit_or_eof() {
        let om = "# HELP a_requests Requests.\n# TYPE a_requests counter\na_requests_total{x=\"1\"} 3 # {trace_id=\"t\"} 1.0\n# HELP b_seconds Time.\n# TYPE b_seconds histogram\n# UNIT b_seconds seconds\nb_seconds_bucket{le=\"+Inf\"} 1\nb_seconds_sum 0.5\nb_seconds_count 1\n# HELP c Gauge.\n# TYPE c gauge\nc 2\n# EOF\n";
        assert_eq!(
            to_text(om),
            "# HELP a_requests_total Requests.\n# TYPE a_requests_total counter\na_requests_total{x=\"1\"} 3\n# HELP b_seconds Time.\n# TYPE b_seconds histogram\nb_seconds_bucket{le=\"+Inf\"} 1\nb_seconds_sum 0.5\nb_seconds_count 1\n# HELP c Gauge.\n# TYPE c gauge\nc 2\n"
        );
        assert_eq!(Format::from_accept(None), Format::Text);
        assert_eq!(
            Format::from_accept(Some(
                "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"
            )),
            Format::OpenMetrics
        );
    }

    #[test]
    fn process_families_are_read_from_proc() {
        let text = process_families();
        let value = |name: &str| -> f64 {
            text.lines()
                .find_map(|l| l.strip_prefix(&format!("{name} ")))
                .unwrap_or_else(|| panic!("{name} missing:\n{text}"))
                .parse()
                .unwrap()
        };
        assert!(
            value("process_resident_memory_bytes") > 1_000_000.0,
            "{text}"
        );
        assert!(value("process_open_fds") >= 3.0, "{text}");
        assert!(
            value("process_start_time_seconds") > 1_600_000_000.0,
            "{text}"
        );
        let om = render(
            "# HELP c Gauge.\n# TYPE c gauge\nc 2\n# EOF\n",
            Format::OpenMetrics,
        );
        assert!(
            om.ends_with("# EOF\n") && om.matches("# EOF").count() == 1,
            "{om}"
        );
        assert!(om.contains("process_cpu_seconds_total "), "{om}");
    }
}
