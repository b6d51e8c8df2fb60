//! Durations and sizes as people read them: `5s`, `100ms`, `2m05s`,
//! `1.50 KiB`. (The CLI parses what people type, in `src/units.rs`.)

/// Formats nanoseconds with the largest unit that keeps a short number:
/// `950ns`, `12.5us`, `3.20ms`, `1.50s`, `2m05s`, `1h02m`.
pub fn format_duration(ns: u64) -> String {
    const US: u64 = 1_000;
    const MS: u64 = 1_000_000;
    const S: u64 = 1_000_000_000;
    if ns < US {
        format!("{ns}ns")
    } else if ns < MS {
        short(ns as f64 / US as f64, "us")
    } else if ns < S {
        short(ns as f64 / MS as f64, "ms")
    } else if ns < 60 * S {
        short(ns as f64 / S as f64, "s")
    } else if ns < 3600 * S {
        let s = ns / S;
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        let m = ns / S / 60;
        format!("{}h{:02}m", m / 60, m % 60)
    }
}

fn short(v: f64, unit: &str) -> String {
    // Thresholds after rounding, so 9.996 prints as 10.0, not 10.00.
    if v >= 99.95 {
        format!("{v:.0}{unit}")
    } else if v >= 9.995 {
        format!("{v:.1}{unit}")
    } else {
        format!("{v:.2}{unit}")
    }
}

/// Formats a byte count with a binary unit: `512 B`, `1.50 KiB`, `3.0 MiB`.
pub fn format_bytes(b: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if b < 1024 {
        return format!("{b} B");
    }
    let mut v = b as f64 / 1024.0;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    short(v, &format!(" {}", UNITS[u]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_durations_and_bytes() {
        assert_eq!(format_duration(950), "950ns");
        assert_eq!(format_duration(12_500), "12.5us");
        assert_eq!(format_duration(3_200_000), "3.20ms");
        assert_eq!(format_duration(1_500_000_000), "1.50s");
        assert_eq!(format_duration(125_000_000_000), "2m05s");
        assert_eq!(format_duration(3_720_000_000_000), "1h02m");
        assert_eq!(format_bytes(512), "512 B");
        assert_eq!(format_bytes(1536), "1.50 KiB");
        assert_eq!(format_bytes(3 << 20), "3.00 MiB");
        assert_eq!(format_duration(9_996_000_000), "10.0s");
    }
}
