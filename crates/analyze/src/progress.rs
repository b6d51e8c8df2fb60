//! A progress bar on stderr for long analyses.
//!
//! Shown only when stderr is a terminal, so logs and pipes stay clean.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressState, ProgressStyle};

/// Progress of a replay, in events.
pub struct Progress {
    bar: Option<ProgressBar>,
}

/// The bar's template. The rate is a key of ours (`{rate}`): indicatif's
/// `{per_sec}` prints four decimals, and a style after it (`{per_sec:.0}`)
/// is read as a colour (0: black, unreadable on a dark terminal).
const TEMPLATE: &str =
    "{spinner} replaying [{bar:40}] {human_pos}/{human_len} events ({rate}, {eta})";

impl Progress {
    /// A bar over `total` events, or nothing when `quiet` or when stderr
    /// is not a terminal.
    pub fn new(total: u64, quiet: bool) -> Self {
        if quiet || !std::io::stderr().is_terminal() {
            return Progress { bar: None };
        }
        Progress::to(total, ProgressDrawTarget::stderr())
    }

    fn to(total: u64, target: ProgressDrawTarget) -> Self {
        let bar = ProgressBar::with_draw_target(Some(total), target);
        bar.set_style(
            ProgressStyle::with_template(TEMPLATE)
                .expect("valid template")
                .with_key("rate", |s: &ProgressState, w: &mut dyn std::fmt::Write| {
                    let _ = w.write_str(&rate(s.per_sec()));
                })
                .progress_chars("=> "),
        );
        Progress { bar: Some(bar) }
    }

    /// Adds `rows` replayed events.
    pub fn advance(&self, rows: u64) {
        if let Some(b) = &self.bar {
            b.inc(rows);
        }
    }

    /// Removes the bar.
    pub fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}

/// Events per second in SI units, three significant digits at most:
/// `850 events/s`, `12.3k events/s`, `4.56M events/s`.
pub fn rate(per_sec: f64) -> String {
    let r = if per_sec.is_finite() {
        per_sec.max(0.0)
    } else {
        0.0
    };
    let (v, unit) = match r {
        r if r < 1e3 => return format!("{r:.0} events/s"),
        r if r < 1e6 => (r / 1e3, "k"),
        r if r < 1e9 => (r / 1e6, "M"),
        r => (r / 1e9, "G"),
    };
    let digits = if v < 10.0 {
        2
    } else if v < 100.0 {
        1
    } else {
        0
    };
    format!("{v:.digits$}{unit} events/s")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[test]
    fn rates_read_in_si_units() {
        assert_eq!(rate(0.0), "0 events/s");
        assert_eq!(rate(850.4), "850 events/s");
        assert_eq!(rate(12_345.0), "12.3k events/s");
        assert_eq!(rate(4_561_234.567_8), "4.56M events/s");
        assert_eq!(rate(123_456_789.0), "123M events/s");
        assert_eq!(rate(2.5e9), "2.50G events/s");
        assert_eq!(rate(f64::NAN), "0 events/s");
    }

    /// A terminal that keeps what is written to it.
    #[derive(Debug, Clone, Default)]
    struct Screen(Arc<Mutex<String>>);

    impl indicatif::TermLike for Screen {
        fn width(&self) -> u16 {
            120
        }
        fn move_cursor_up(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn move_cursor_down(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn move_cursor_right(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn move_cursor_left(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn write_line(&self, s: &str) -> std::io::Result<()> {
            self.write_str(&format!("{s}\n"))
        }
        fn write_str(&self, s: &str) -> std::io::Result<()> {
            self.0.lock().unwrap().push_str(s);
            Ok(())
        }
        fn clear_line(&self) -> std::io::Result<()> {
            Ok(())
        }
        fn flush(&self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn the_bar_shows_its_rate_uncoloured_and_in_human_units() {
        let screen = Screen::default();
        let p = Progress::to(
            10_000_000,
            ProgressDrawTarget::term_like(Box::new(screen.clone())),
        );
        for _ in 0..5 {
            p.advance(100_000);
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        p.bar.as_ref().unwrap().force_draw();
        let drawn = screen.0.lock().unwrap().clone();
        let line = drawn.lines().last().unwrap_or_default().to_string();
        // No escape sequence at all: nothing is drawn in a colour.
        assert!(!drawn.contains('\x1b'), "{drawn:?}");
        let at = line.find(" events/s").expect("a rate");
        let figure = line[..at].rsplit('(').next().unwrap();
        assert!(
            figure.len() <= 5 && !figure.contains("events"),
            "rate {figure:?} in {line:?}"
        );
        let digits = figure.trim_end_matches(['k', 'M', 'G']);
        let decimals = digits.split('.').nth(1).map_or(0, str::len);
        assert!(decimals <= 2, "{line:?}");
        assert!(digits.parse::<f64>().unwrap() > 0.0, "{line:?}");
    }
}
