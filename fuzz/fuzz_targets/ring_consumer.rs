//! `cargo fuzz run ring_consumer`: the recorder's drain of the agent's
//! ring, against a ring written by a hostile process as the input says
//! (`memleak_recorder::agent::fuzz_drain`: bytes over the slots, events
//! well framed or not, `head` moved, loss counters set, slots claimed and
//! left). A hang, a panic, or an event of another process handed on is a
//! bug.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    memleak_recorder::agent::fuzz_drain(data);
});
