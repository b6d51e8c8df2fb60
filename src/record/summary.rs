//! What `record` says when it is done: one line of figures in one set of
//! units, and the command to run next.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use memleak_recorder::Stats;

use crate::units::human_duration;

/// `recorded N events in 4.20 s (…), S stacks, F frames to PATH; lost …`.
pub(super) fn figures(
    stats: &Stats,
    elapsed: Duration,
    cpu_ns: u64,
    output: &Path,
    lost: &BTreeMap<String, u64>,
) -> String {
    // Per event, once there is one to divide by.
    let cpu = match cpu_ns.checked_div(stats.events) {
        Some(per_event) => format!(
            "{} of memleak's CPU per event",
            human_duration(Duration::from_nanos(per_event))
        ),
        None => format!(
            "{} of memleak's CPU",
            human_duration(Duration::from_nanos(cpu_ns))
        ),
    };
    let total = lost.values().fold(0u64, |a, &n| a.saturating_add(n));
    let lost = if total == 0 {
        "no events lost".to_string()
    } else {
        let reasons: Vec<String> = lost
            .iter()
            .filter(|(_, &n)| n > 0)
            .map(|(why, n)| format!("{n} {why}"))
            .collect();
        format!("lost {total} events ({})", reasons.join(", "))
    };
    format!(
        "memleak: recorded {} events in {} ({cpu}), {} stacks, {} frames to {}; {lost}",
        stats.events,
        human_duration(elapsed),
        stats.stacks,
        stats.frames,
        output.display(),
    )
}

/// `next: memleak analyze PATH`, the path quoted for a shell if it must be.
pub(super) fn next_command(output: &Path) -> String {
    format!(
        "memleak: next: memleak analyze {}",
        shell_word(&output.to_string_lossy())
    )
}

fn shell_word(s: &str) -> String {
    let plain = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "/._-+:,@%=".contains(c));
    if plain {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_is_in_one_set_of_units_and_says_what_to_run_next() {
        let stats = Stats {
            events: 1000,
            stacks: 3,
            frames: 12,
            ..Stats::default()
        };
        let lost = BTreeMap::from([("ring_full".to_string(), 0)]);
        assert_eq!(
            figures(
                &stats,
                Duration::from_millis(1620),
                21_242_000,
                Path::new("t.parquet"),
                &lost
            ),
            "memleak: recorded 1000 events in 1.62 s (21 us of memleak's CPU per event), \
             3 stacks, 12 frames to t.parquet; no events lost"
        );
        let none = Stats::default();
        assert_eq!(
            figures(
                &none,
                Duration::from_secs(3),
                204_100_000,
                Path::new("t"),
                &lost
            ),
            "memleak: recorded 0 events in 3.00 s (204.1 ms of memleak's CPU), 0 stacks, \
             0 frames to t; no events lost"
        );
        assert_eq!(
            next_command(Path::new("/tmp/my trace")),
            "memleak: next: memleak analyze '/tmp/my trace'"
        );
    }
}
