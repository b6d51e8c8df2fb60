//! bcc memleak's flags that mean something else here, or live in another
//! subcommand: a one-line hint instead of clap's bare "unexpected
//! argument" (docs/migrating.md has the whole mapping).

/// The hint for an option `record` does not take, as the user typed it
/// (`-a`, `--older=5000`), if bcc's memleak has it.
pub fn record_hint(arg: &str) -> Option<&'static str> {
    let name = arg.split_once('=').map_or(arg, |(name, _)| name);
    Some(match name {
        "-a" | "--show-allocs" => {
            "bcc's -a lists each outstanding block: every block is in the trace; \
             `memleak analyze TRACE` groups them by stack, and the trace's events \
             table (Parquet, DuckDB) has each address and size"
        }
        "-s" | "--sample-rate" => {
            "bcc's -s samples 1 allocation in N: memleak records every one (its \
             outstanding figures are exact); record less with -z/--min-size, and a \
             command's default capture (--capture preload) is the cheap one"
        }
        "--older" | "--older-than" => {
            "bcc's -o/--older keeps blocks older than N ms: that is `memleak analyze \
             TRACE --older-than 5s` (a bare number is seconds), on the whole recording"
        }
        "-t" | "--trace" => {
            "bcc's -t prints every call: every call is in the trace, with its stack \
             (`memleak analyze TRACE`, or the events table with DuckDB)"
        }
        "--combined-only" | "--wa-missing-free" => {
            "memleak keeps every block and never drops a free, so this bcc flag has \
             nothing to do; lost events are counted and reported instead"
        }
        "--obj" => "bcc's --obj is -O/--object LIB here",
        "--sort" => "sorting is `memleak analyze TRACE --sort bytes|count|...`",
        _ => return None,
    })
}

/// A warning for `record -o N`: bcc's -o is "older than N ms", here it
/// names the trace. `None` unless the output is a bare number (with an
/// optional ms or s).
#[cfg_attr(not(feature = "bpf"), allow(dead_code))] // record only
pub fn numeric_output_warning(output: &str) -> Option<String> {
    let digits = output
        .strip_suffix("ms")
        .or_else(|| output.strip_suffix('s'))
        .unwrap_or(output);
    if digits.is_empty() || !digits.chars().all(|c| c.is_ascii_digit()) {
        return None;
    }
    Some(format!(
        "-o {output} writes the trace to ./{output}: -o is the output here; bcc's -o \
         (older than, in ms) is `memleak analyze TRACE --older-than {digits}ms`"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bcc_flags_get_a_hint_and_others_none() {
        assert!(record_hint("-a").unwrap().contains("analyze"));
        assert!(record_hint("--older=5000")
            .unwrap()
            .contains("--older-than"));
        assert!(record_hint("--frobnicate").is_none());
        assert!(numeric_output_warning("5000")
            .unwrap()
            .contains("--older-than 5000ms"));
        assert!(numeric_output_warning("trace.parquet").is_none());
        assert!(numeric_output_warning("t5").is_none());
    }
}
