//! The one trait every output format implements ([`Render`]), for
//! reports (`report/`) and diffs (`diff/`) alike: a format is a value
//! (holding its options, such as the flamegraph's weight) that writes
//! what it renders to any writer. The CLI picks one and writes it; adding
//! a format is adding a file with one more implementation.

use std::io;

/// An output format of `T`: a [`Report`](crate::model::Report) or a
/// [`Diff`](crate::diff::Diff).
pub trait Render<T: ?Sized> {
    /// The file `--format all` writes this format to.
    fn file_name(&self) -> &'static str;

    /// Writes `input` in this format to `out`.
    fn write(&self, input: &T, out: &mut (dyn io::Write + Send)) -> io::Result<()>;

    /// `input` in this format, in memory.
    fn render(&self, input: &T) -> io::Result<Vec<u8>> {
        let mut out = Vec::new();
        self.write(input, &mut out)?;
        Ok(out)
    }
}
