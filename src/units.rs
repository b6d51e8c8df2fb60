//! Durations and sizes as people type them, for every command's options:
//! one grammar for `record -d` and `analyze --at`, one for `record -z` and
//! `analyze --min-size`.

use std::time::Duration;

const NS_PER_UNIT: [(&str, u64); 9] = [
    ("ns", 1),
    ("us", 1_000),
    ("µs", 1_000),
    ("ms", 1_000_000),
    ("s", 1_000_000_000),
    ("sec", 1_000_000_000),
    ("m", 60_000_000_000),
    ("min", 60_000_000_000),
    ("h", 3_600_000_000_000),
];

/// Parses `10s`, `500ms`, `2m`, `1h`, `250us`, `100ns`, `1.5s` into
/// nanoseconds; a bare number is seconds. Decimals are exact (`0.1s` is
/// 100 ms), digits past the nanosecond are dropped.
pub fn parse_duration_ns(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let unit = unit.trim();
    let bad = |why: &str| format!("invalid duration {text:?}: {why}");
    if num.is_empty() || num == "." {
        return Err(bad("expected a number and a unit, like 10s or 500ms"));
    }
    let scale = match NS_PER_UNIT.iter().find(|(u, _)| *u == unit) {
        Some(&(_, scale)) => scale,
        None if unit.is_empty() => 1_000_000_000,
        None => {
            return Err(bad(&format!(
                "unknown unit {unit:?} (use ns, us, ms, s, m, h)"
            )))
        }
    };
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    if frac.contains('.') {
        return Err(bad("more than one decimal point"));
    }
    let int: u64 = if int.is_empty() {
        0
    } else {
        int.parse().map_err(|_| bad("too large"))?
    };
    // The fraction in integer arithmetic: each digit is a tenth of the last.
    let mut frac_ns = 0u64;
    let mut place = scale;
    for c in frac.bytes() {
        place /= 10;
        frac_ns += u64::from(c - b'0') * place;
    }
    int.checked_mul(scale)
        .and_then(|v| v.checked_add(frac_ns))
        .ok_or_else(|| bad("too large"))
}

/// [`parse_duration_ns`] as a [`Duration`].
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    parse_duration_ns(text).map(Duration::from_nanos)
}

/// [`parse_duration`], refusing zero (a recording that stops at once, a
/// temporary threshold nothing meets).
pub fn parse_positive_duration(text: &str) -> Result<Duration, String> {
    match parse_duration(text)? {
        Duration::ZERO => Err(format!("invalid duration {text:?}: must be more than 0")),
        d => Ok(d),
    }
}

/// Formats a duration the way [`parse_duration`] reads it, exactly, in the
/// largest unit that divides it: `10s`, `1500ms`, `250us`, `7ns`.
pub fn format_duration(d: Duration) -> String {
    let ns = d.as_nanos();
    if ns == 0 {
        return "0s".to_string();
    }
    for (unit, scale) in [("h", 3_600_000_000_000), ("m", 60_000_000_000)] {
        if ns % scale == 0 {
            return format!("{}{unit}", ns / scale);
        }
    }
    for (unit, scale) in [("s", 1_000_000_000), ("ms", 1_000_000), ("us", 1_000)] {
        if ns % scale == 0 {
            return format!("{}{unit}", ns / scale);
        }
    }
    format!("{ns}ns")
}

/// Parses `4096`, `1k`, `64M`, `2G`, `1KiB`, `1kb`: bytes, in binary
/// multiples (k is 1024), units in any case.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let unit = unit.trim();
    let bad = |why: &str| format!("invalid size {text:?}: {why}");
    if num.is_empty() {
        return Err(bad("expected a number of bytes, like 4096 or 64M"));
    }
    let shift = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        _ if unit.starts_with('.') => return Err(bad("use a whole number (1536k, not 1.5M)")),
        _ => return Err(bad(&format!("unknown unit {unit:?} (use k, M, G)"))),
    };
    let too_large = || bad("too large");
    let n: u64 = num.parse().map_err(|_| too_large())?;
    n.checked_mul(1 << shift).ok_or_else(too_large)
}

/// Formats a byte count in the largest binary unit that divides it:
/// `4096` is `4 KiB`, `1000` is `1000 bytes`.
#[cfg_attr(not(feature = "bpf"), allow(dead_code))] // record only
pub fn format_size(n: u64) -> String {
    for (unit, shift) in [("GiB", 30), ("MiB", 20), ("KiB", 10)] {
        if n != 0 && n % (1 << shift) == 0 {
            return format!("{} {unit}", n >> shift);
        }
    }
    format!("{n} bytes")
}

/// Year, month, day, hours, minutes and seconds (UTC) of a Unix time.
pub fn utc_fields(secs: u64) -> [u64; 6] {
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let doe = (days + 719_468) % 146_097;
    let era = (days + 719_468) / 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    [year, month, day, rem / 3600, rem / 60 % 60, rem % 60]
}

/// A byte count for people, in one set of units: `680 B`, `125.0 KiB`,
/// `3.4 MiB`, `1.2 GiB` (binary multiples, one decimal).
#[cfg_attr(not(feature = "bpf"), allow(dead_code))] // record only
pub fn human_size(n: u64) -> String {
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    for unit in ["KiB", "MiB", "GiB"] {
        if v < 1024.0 || unit == "GiB" {
            return format!("{v:.1} {unit}");
        }
        v /= 1024.0;
    }
    unreachable!()
}

/// A signed byte change for people: `+1.5 KiB`, `-20 B`, `0 B`.
#[cfg_attr(not(feature = "bpf"), allow(dead_code))] // record only
pub fn human_change(delta: i64) -> String {
    let size = human_size(delta.unsigned_abs());
    match delta {
        0 => size,
        d if d > 0 => format!("+{size}"),
        _ => format!("-{size}"),
    }
}

/// A time span for people, in one set of units: `850 us`, `12.3 ms`,
/// `4.20 s`, `3m05s`.
#[cfg_attr(not(feature = "bpf"), allow(dead_code))] // record only
pub fn human_duration(d: Duration) -> String {
    let ns = d.as_nanos();
    if ns < 1_000 {
        // The recorder's CPU per event: "0 us" said nothing.
        format!("{ns} ns")
    } else if ns < 1_000_000 {
        format!("{} us", ns / 1000)
    } else if ns < 1_000_000_000 {
        format!("{:.1} ms", ns as f64 / 1e6)
    } else if ns < 60_000_000_000 {
        format!("{:.2} s", ns as f64 / 1e9)
    } else {
        let s = d.as_secs();
        format!("{}m{:02}s", s / 60, s % 60)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_times_for_people() {
        assert_eq!(human_size(680), "680 B");
        assert_eq!(human_size(128_000), "125.0 KiB");
        assert_eq!(human_size(3 << 20), "3.0 MiB");
        assert_eq!(human_change(-20), "-20 B");
        assert_eq!(human_change(1536), "+1.5 KiB");
        assert_eq!(human_change(0), "0 B");
        assert_eq!(human_duration(Duration::from_micros(850)), "850 us");
        assert_eq!(human_duration(Duration::from_nanos(97)), "97 ns");
        assert_eq!(human_duration(Duration::from_millis(1620)), "1.62 s");
        assert_eq!(human_duration(Duration::from_secs(185)), "3m05s");
    }

    #[test]
    fn durations_with_units_and_fractions() {
        assert_eq!(parse_duration_ns("10s"), Ok(10_000_000_000));
        assert_eq!(parse_duration_ns("500ms"), Ok(500_000_000));
        assert_eq!(parse_duration_ns("2m"), Ok(120_000_000_000));
        assert_eq!(parse_duration_ns("1h"), Ok(3_600_000_000_000));
        assert_eq!(parse_duration_ns("250us"), Ok(250_000));
        assert_eq!(parse_duration_ns("100ns"), Ok(100));
        assert_eq!(parse_duration_ns("1.5s"), Ok(1_500_000_000));
        assert_eq!(parse_duration_ns("0.1s"), Ok(100_000_000));
        assert_eq!(parse_duration_ns(".25ms"), Ok(250_000));
        assert_eq!(parse_duration_ns("1.5h"), Ok(5_400_000_000_000));
        assert_eq!(parse_duration_ns(" 3 s "), Ok(3_000_000_000));
        assert_eq!(parse_duration_ns("0"), Ok(0));
    }

    #[test]
    fn a_bare_number_is_seconds() {
        assert_eq!(parse_duration_ns("5"), Ok(5_000_000_000));
        assert_eq!(parse_duration_ns("2.5"), Ok(2_500_000_000));
        assert_eq!(parse_duration("7"), Ok(Duration::from_secs(7)));
    }

    #[test]
    fn bad_durations_say_why() {
        assert_eq!(
            parse_duration_ns("5parsecs"),
            Err(
                r#"invalid duration "5parsecs": unknown unit "parsecs" (use ns, us, ms, s, m, h)"#
                    .into()
            )
        );
        assert!(parse_duration_ns("s")
            .unwrap_err()
            .contains("expected a number"));
        assert!(parse_duration_ns("")
            .unwrap_err()
            .contains("expected a number"));
        assert!(parse_duration_ns("-1s")
            .unwrap_err()
            .contains("expected a number"));
        assert!(parse_duration_ns("1.2.3s")
            .unwrap_err()
            .contains("decimal point"));
        assert!(parse_duration_ns("10M")
            .unwrap_err()
            .contains("unknown unit \"M\""));
        assert_eq!(
            parse_positive_duration("0s"),
            Err(r#"invalid duration "0s": must be more than 0"#.into())
        );
        assert!(parse_positive_duration("1ns").is_ok());
    }

    #[test]
    fn duration_overflow_is_detected() {
        // u64 nanoseconds end after about 584 years.
        assert_eq!(parse_duration_ns("18446744073709551615ns"), Ok(u64::MAX));
        assert!(parse_duration_ns("18446744073709551616ns")
            .unwrap_err()
            .ends_with("too large"));
        assert!(parse_duration_ns("5200000h")
            .unwrap_err()
            .ends_with("too large"));
        assert!(parse_duration_ns("99999999999999999999999s")
            .unwrap_err()
            .ends_with("too large"));
        assert!(parse_duration_ns("18446744073.9s")
            .unwrap_err()
            .ends_with("too large"));
    }

    #[test]
    fn durations_format_as_they_parse() {
        for (d, text) in [
            (Duration::from_secs(10), "10s"),
            (Duration::from_millis(1500), "1500ms"),
            (Duration::from_secs(120), "2m"),
            (Duration::from_secs(7200), "2h"),
            (Duration::from_micros(250), "250us"),
            (Duration::from_nanos(7), "7ns"),
            (Duration::ZERO, "0s"),
        ] {
            assert_eq!(format_duration(d), text);
            assert_eq!(parse_duration(text), Ok(d));
        }
    }

    #[test]
    fn sizes_with_binary_units_in_any_case() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("1k"), Ok(1024));
        assert_eq!(parse_size("1K"), Ok(1024));
        assert_eq!(parse_size("64M"), Ok(64 << 20));
        assert_eq!(parse_size("64m"), Ok(64 << 20));
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        assert_eq!(parse_size("1KiB"), Ok(1024));
        assert_eq!(parse_size("1kib"), Ok(1024));
        assert_eq!(parse_size("1kb"), Ok(1024));
        assert_eq!(parse_size("3MB"), Ok(3 << 20));
        assert_eq!(parse_size("5 GiB"), Ok(5 << 30));
        assert_eq!(parse_size("10b"), Ok(10));
        assert_eq!(parse_size("0"), Ok(0));
    }

    #[test]
    fn bad_sizes_say_why() {
        assert_eq!(
            parse_size("12q"),
            Err(r#"invalid size "12q": unknown unit "q" (use k, M, G)"#.into())
        );
        assert!(parse_size("M").unwrap_err().contains("expected a number"));
        assert!(parse_size("").unwrap_err().contains("expected a number"));
        assert!(parse_size("-1").unwrap_err().contains("expected a number"));
        assert!(parse_size("1.5M").unwrap_err().contains("whole number"));
        assert!(parse_size("1T").unwrap_err().contains("unknown unit \"T\""));
    }

    #[test]
    fn size_overflow_is_detected() {
        assert_eq!(parse_size("18446744073709551615"), Ok(u64::MAX));
        assert_eq!(
            parse_size("18446744073709551616"),
            Err(r#"invalid size "18446744073709551616": too large"#.into())
        );
        assert_eq!(parse_size("17179869183G"), Ok(17179869183 << 30));
        assert!(parse_size("17179869184G")
            .unwrap_err()
            .ends_with("too large"));
        assert!(parse_size("16777216T").is_err());
    }

    #[test]
    fn sizes_format_in_the_largest_unit() {
        assert_eq!(format_size(4096), "4 KiB");
        assert_eq!(format_size(1 << 30), "1 GiB");
        assert_eq!(format_size(64 << 20), "64 MiB");
        assert_eq!(format_size(1000), "1000 bytes");
        assert_eq!(format_size(0), "0 bytes");
    }
}
