//! Durations as people type and read them: `5s`, `100ms`, `2m`, `1.5h`.

/// Parses a duration with a unit (`ns`, `us`, `ms`, `s`, `m`, `h`, `d`)
/// into nanoseconds. A bare number is refused: `5` could mean seconds
/// (as here) or milliseconds (as bcc's `-o`), so the unit is required.
pub fn parse_duration(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    if num.is_empty() {
        return Err(format!(
            "invalid duration {text:?}: expected a number and a unit, like 5s or 100ms"
        ));
    }
    let scale: u64 = match unit.trim() {
        "ns" => 1,
        "us" | "µs" => 1_000,
        "ms" => 1_000_000,
        "s" | "sec" => 1_000_000_000,
        "m" | "min" => 60_000_000_000,
        "h" => 3_600_000_000_000,
        "d" => 86_400_000_000_000,
        "" => {
            return Err(format!(
                "invalid duration {text:?}: missing unit (ns, us, ms, s, m, h)"
            ))
        }
        other => {
            return Err(format!(
                "invalid duration {text:?}: unknown unit {other:?} (ns, us, ms, s, m, h)"
            ))
        }
    };
    if let Some((int, frac)) = num.split_once('.') {
        let int: u64 = if int.is_empty() {
            0
        } else {
            int.parse()
                .map_err(|_| format!("invalid duration {text:?}"))?
        };
        if frac.contains('.') {
            return Err(format!("invalid duration {text:?}"));
        }
        // Decimal fraction without floating point, so 0.1s is exactly 100ms.
        let mut frac_ns = 0u64;
        let mut place = scale;
        for c in frac.chars() {
            place /= 10;
            frac_ns += (c as u64 - '0' as u64) * place;
        }
        int.checked_mul(scale)
            .and_then(|v| v.checked_add(frac_ns))
            .ok_or_else(|| format!("duration {text:?} is too large"))
    } else {
        let n: u64 = num
            .parse()
            .map_err(|_| format!("invalid duration {text:?}"))?;
        n.checked_mul(scale)
            .ok_or_else(|| format!("duration {text:?} is too large"))
    }
}

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
    fn parses_units_and_fractions() {
        assert_eq!(parse_duration("5s"), Ok(5_000_000_000));
        assert_eq!(parse_duration("100ms"), Ok(100_000_000));
        assert_eq!(parse_duration("2m"), Ok(120_000_000_000));
        assert_eq!(parse_duration("1.5h"), Ok(5_400_000_000_000));
        assert_eq!(parse_duration("0.1s"), Ok(100_000_000));
        assert_eq!(parse_duration(".25ms"), Ok(250_000));
        assert_eq!(parse_duration("7ns"), Ok(7));
        assert_eq!(parse_duration("3us"), Ok(3_000));
        assert!(parse_duration("5").unwrap_err().contains("missing unit"));
        assert!(parse_duration("5parsecs").is_err());
        assert!(parse_duration("s").is_err());
        assert!(parse_duration("1.2.3s").is_err());
    }

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
