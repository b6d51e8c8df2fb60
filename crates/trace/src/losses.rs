//! What the reasons of `counters.lost` in `meta.json` mean for a report,
//! and how each is said: the one place `record`, `analyze`, `diff` and
//! every report format take their loss warnings from.
//!
//! A reason either means events are **missing** from the trace (an
//! allocation or a free the replay never sees, so every outstanding
//! figure is uncertain: a lost free leaves a block outstanding for ever,
//! a lost allocation leaves it out), or the event was kept **without its
//! stack** (`stack_failed`: its bytes count, under `[no stack]`), or it is
//! **not a loss** at all (`failed_alloc`: allocations that returned NULL,
//! which older recorders counted there). A reason this version does not
//! know (a newer recorder's) is taken as missing events: figures that may
//! be wrong are flagged, never silently trusted.

use std::collections::BTreeMap;

/// What the events counted under a reason mean for the report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LossEffect {
    /// Events or whole calls are missing from the trace: outstanding
    /// figures are uncertain.
    Missing,
    /// The event is in the trace without its stack.
    StackMissing,
    /// Not a loss (an allocation that failed in the program).
    NotALoss,
}

/// One reason of `counters.lost`: its name in `meta.json`, its effect,
/// and how a count of it is said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LossReason {
    /// Name in `meta.json`.
    pub name: &'static str,
    /// What it means for the report.
    pub effect: LossEffect,
    /// What was lost, singular and plural (`event lost`, `events lost`).
    pub what: (&'static str, &'static str),
    /// Why, in a few words.
    pub why: &'static str,
}

/// Every reason a recorder writes, in the order reports list them.
pub const LOSS_REASONS: &[LossReason] = &[
    LossReason {
        name: "ring_full",
        effect: LossEffect::Missing,
        what: ("event lost", "events lost"),
        why: "ring buffer full",
    },
    LossReason {
        name: "inflight_full",
        effect: LossEffect::Missing,
        what: ("call not traced", "calls not traced"),
        why: "no free per-thread or nesting slot",
    },
    LossReason {
        name: "unsafe_return",
        effect: LossEffect::Missing,
        what: ("call not traced", "calls not traced"),
        why: "a signal stack above the thread's stack; tracing them could crash the program",
    },
    LossReason {
        name: "sample_set_full",
        effect: LossEffect::Missing,
        what: (
            "sampled allocation not recorded",
            "sampled allocations not recorded",
        ),
        why: "the agent's set of sampled addresses was full",
    },
    LossReason {
        name: "unfinished",
        effect: LossEffect::Missing,
        what: ("event lost", "events lost"),
        why: "the process died while the agent was writing it",
    },
    LossReason {
        name: "corrupt_slot",
        effect: LossEffect::Missing,
        what: ("record rejected", "records rejected"),
        why: "the traced process wrote into the agent's shared memory what no agent writes",
    },
    LossReason {
        name: "unprobed_process",
        effect: LossEffect::Missing,
        what: ("process ran unrecorded", "processes ran unrecorded"),
        why: "its allocator was found only at its exit",
    },
    LossReason {
        name: "recursion",
        effect: LossEffect::Missing,
        what: ("kernel event lost", "kernel events lost"),
        why: "the kernel skipped a probe already running on the CPU",
    },
    LossReason {
        name: "malformed",
        effect: LossEffect::Missing,
        what: ("event lost", "events lost"),
        why: "records the decoder rejected",
    },
    LossReason {
        name: "stack_failed",
        effect: LossEffect::StackMissing,
        what: (
            "event recorded without its stack",
            "events recorded without their stack",
        ),
        why: "capturing it failed",
    },
    LossReason {
        name: "failed_alloc",
        effect: LossEffect::NotALoss,
        what: ("allocation failed", "allocations failed"),
        why: "the allocator returned NULL",
    },
];

/// The reason named `name`, if this version knows it.
pub fn loss_reason(name: &str) -> Option<&'static LossReason> {
    LOSS_REASONS.iter().find(|r| r.name == name)
}

/// The effect of reason `name`: a name this version does not know counts
/// as missing events.
pub fn loss_effect(name: &str) -> LossEffect {
    loss_reason(name).map_or(LossEffect::Missing, |r| r.effect)
}

/// `548983 events lost (ring buffer full)`: a count of reason `name`.
pub fn describe_loss(name: &str, n: u64) -> String {
    match loss_reason(name) {
        Some(r) => {
            let what = if n == 1 { r.what.0 } else { r.what.1 };
            format!("{n} {what} ({})", r.why)
        }
        None => {
            let what = if n == 1 { "event" } else { "events" };
            format!("{n} {what} lost (reason \"{name}\")")
        }
    }
}

/// The losses of one recording, sorted by effect.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Losses {
    /// Reasons whose events or calls are missing, with their (non-zero)
    /// counts: known reasons in [`LOSS_REASONS`] order, then unknown
    /// ones by name.
    pub missing: Vec<(String, u64)>,
    /// Events kept without their stack (`stack_failed`).
    pub stackless: u64,
}

impl Losses {
    /// Sorts `counters.lost` (reason -> count) by effect.
    pub fn of(lost: &BTreeMap<String, u64>) -> Losses {
        let mut out = Losses::default();
        let rank = |name: &str| {
            LOSS_REASONS
                .iter()
                .position(|r| r.name == name)
                .unwrap_or(LOSS_REASONS.len())
        };
        for (name, &n) in lost.iter().filter(|(_, &n)| n > 0) {
            match loss_effect(name) {
                LossEffect::Missing => out.missing.push((name.clone(), n)),
                LossEffect::StackMissing => out.stackless += n,
                LossEffect::NotALoss => {}
            }
        }
        // Stable: unknown names stay in name order after the known ones.
        out.missing.sort_by_key(|(name, _)| rank(name));
        out
    }

    /// Whether events are missing, so outstanding figures are uncertain.
    pub fn uncertain(&self) -> bool {
        !self.missing.is_empty()
    }

    /// Events and calls missing, all reasons.
    pub fn missing_total(&self) -> u64 {
        self.missing.iter().map(|(_, n)| n).sum()
    }

    /// The count of one reason among the missing ones (0 if none).
    pub fn missing_of(&self, name: &str) -> u64 {
        self.missing
            .iter()
            .find(|(r, _)| r == name)
            .map_or(0, |(_, n)| *n)
    }

    /// What is missing, reason by reason: `548983 events lost (ring
    /// buffer full), 12 calls not traced (…)`. Empty when nothing is.
    pub fn describe(&self) -> String {
        let parts: Vec<String> = self
            .missing
            .iter()
            .map(|(name, n)| describe_loss(name, *n))
            .collect();
        parts.join(", ")
    }

    /// The warning every command and report gives, one line without a
    /// prefix: `548983 events lost (ring buffer full): outstanding figures
    /// are uncertain`. `None` when nothing is missing.
    pub fn warning(&self) -> Option<String> {
        self.uncertain()
            .then(|| format!("{}: outstanding figures are uncertain", self.describe()))
    }

    /// The milder note of events kept without their stack:
    /// `12 events recorded without their stack (capturing it failed): they
    /// count under [no stack]`. `None` when there are none.
    pub fn stack_note(&self) -> Option<String> {
        (self.stackless > 0).then(|| {
            format!(
                "{}: they count under [no stack]",
                describe_loss("stack_failed", self.stackless)
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, u64)]) -> BTreeMap<String, u64> {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    #[test]
    fn dropped_events_make_figures_uncertain_and_others_do_not() {
        let l = Losses::of(&map(&[
            ("ring_full", 548_983),
            ("stack_failed", 7),
            ("failed_alloc", 3),
            ("recursion", 0),
            ("inflight_full", 0),
        ]));
        assert!(l.uncertain());
        assert_eq!(l.missing, [("ring_full".to_string(), 548_983)]);
        assert_eq!(l.stackless, 7);
        assert_eq!(
            l.warning().unwrap(),
            "548983 events lost (ring buffer full): outstanding figures are uncertain"
        );
        assert_eq!(
            l.stack_note().unwrap(),
            "7 events recorded without their stack (capturing it failed): they count under [no stack]"
        );

        let kept = Losses::of(&map(&[("stack_failed", 1), ("failed_alloc", 9)]));
        assert!(!kept.uncertain());
        assert_eq!(kept.warning(), None);
        assert!(kept
            .stack_note()
            .unwrap()
            .starts_with("1 event recorded without its stack"));
        assert_eq!(Losses::of(&BTreeMap::new()), Losses::default());
    }

    #[test]
    fn reasons_are_listed_in_table_order_and_unknown_ones_are_losses() {
        let l = Losses::of(&map(&[
            ("zzz_new", 2),
            ("malformed", 1),
            ("unsafe_return", 12),
            ("a_newer_reason", 1),
            ("ring_full", 5),
        ]));
        let names: Vec<&str> = l.missing.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "ring_full",
                "unsafe_return",
                "malformed",
                "a_newer_reason",
                "zzz_new"
            ]
        );
        assert_eq!(l.missing_total(), 21);
        assert_eq!(l.missing_of("unsafe_return"), 12);
        assert_eq!(l.missing_of("inflight_full"), 0);
        assert_eq!(
            l.describe(),
            "5 events lost (ring buffer full), 12 calls not traced (a signal stack above the \
             thread's stack; tracing them could crash the program), 1 event lost (records the \
             decoder rejected), 1 event lost (reason \"a_newer_reason\"), 2 events lost (reason \
             \"zzz_new\")"
        );
        assert_eq!(loss_effect("something_else"), LossEffect::Missing);
        assert_eq!(loss_effect("stack_failed"), LossEffect::StackMissing);
        assert_eq!(loss_effect("failed_alloc"), LossEffect::NotALoss);
    }
}
